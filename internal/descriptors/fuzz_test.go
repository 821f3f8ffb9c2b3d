package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics; it returns a config or an ErrorList of
// positioned errors, and a config it returns dumps and matches.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	bad, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range append(append(seeds, bad...), filepath.Join("..", "..", "config", "limits.yaml")) {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a Config with an error")
			}
			list, ok := err.(ErrorList)
			if !ok || len(list) == 0 {
				t.Fatalf("Parse error %T %v, want a non-empty ErrorList", err, err)
			}
			for _, e := range list {
				if e.File != "fuzz.yaml" || e.Line < 1 || e.Column < 1 || !strings.HasPrefix(e.Error(), "fuzz.yaml:") {
					t.Fatalf("badly placed error %+v", e)
				}
			}
			return
		}
		if _, err := c.MarshalJSON(); err != nil {
			t.Fatalf("MarshalJSON: %v", err)
		}
		for i, l := range c.Limits() {
			if l.Index != i || l.Descriptor == nil || l.ID == "" || l.Label == "" {
				t.Fatalf("limit %d: %+v", i, l)
			}
		}
		for _, d := range c.Domains() {
			for _, n := range d.Descriptors {
				if got := d.Match([]Entry{{Key: n.Key, Value: n.Value}}); got == nil {
					t.Fatalf("Match(%s=%s) = nil for a configured top-level node", n.Key, n.Value)
				}
			}
			d.BuildHTTPDescriptors(req("10.0.0.1", ":path", "/a?b=c", ":method", "GET"), nil)
		}
	})
}
