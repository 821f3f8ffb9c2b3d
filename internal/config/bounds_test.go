package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/engine"
)

// TestParseAliasTextBomb: a 1 MiB file that uses one 1 MiB text through
// 500 aliases (500 MiB once expanded) is refused, early and cheaply.
func TestParseAliasTextBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      text: &t \"")
	b.WriteString(strings.Repeat("x", 1<<20))
	b.WriteString("\"\n      copies: [")
	for i := range 500 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*t")
	}
	b.WriteString("]\n")
	data := []byte(b.String())
	var err error
	n := allocated(func() { _, err = Parse("bomb.yaml", data) })
	want := fmt.Sprintf("bomb.yaml:6:24: aliases expand to more than %d bytes of text (the file's size plus 1 MiB): each use of an alias repeats its text", len(data)+1<<20)
	if err == nil || err.Error() != want {
		t.Errorf("Parse(1 MiB text aliased 500 times) error = %v, want %s", err, want)
	}
	if n > 16*uint64(len(data)) {
		t.Errorf("Parse(1 MiB text aliased 500 times) allocated %d bytes, want at most 16 times the file (%d)", n, 16*len(data))
	}
}

// TestParseAliasesWithinBounds: aliases used the ordinary way (one limit
// and one metadata map shared by many descriptors) load.
func TestParseAliasesWithinBounds(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: user\n    value: u0\n" +
		"    rate_limit: &ps {unit: second, requests_per_unit: 10, algorithm: sliding_window}\n    metadata: &meta {team: payments, tier: gold}\n")
	const n = 2000
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "  - {key: user, value: u%d, rate_limit: *ps, metadata: *meta}\n", i)
	}
	c := parseString(t, b.String())
	limits := c.Limits()
	if len(limits) != n {
		t.Fatalf("Parse(%d descriptors sharing an aliased limit) = %d limits, want %d", n, len(limits), n)
	}
	last := limits[n-1]
	if last.Rule.Limit != 10 || last.Rule.Algorithm() != engine.SlidingWindow || last.Descriptor.Metadata["team"] != "payments" {
		t.Errorf("descriptor %s: limit %+v, metadata %v; want the aliased ones", last.Descriptor.Path, last, last.Descriptor.Metadata)
	}
}

// TestParseLongPathsBounded: a long key repeated in the path of every
// descriptor below it (and in their labels) is bounded in proportion to
// the file; the same tree with a short key loads.
func TestParseLongPathsBounded(t *testing.T) {
	tree := func(key string, children int) []byte {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n  - key: " + key + "\n    descriptors:\n")
		for i := range children {
			fmt.Fprintf(&b, "      - {key: c%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
		}
		return []byte(b.String())
	}
	short := tree("tenant", 1000)
	if _, err := Parse("short.yaml", short); err != nil {
		t.Fatalf("Parse(1000 children under a short key): %v", err)
	}
	long := tree(strings.Repeat("k", 64<<10), 1000) // 64 KiB × 2 (path, label) × 1000 children: 128 MB of names
	var err error
	n := allocated(func() { _, err = Parse("long.yaml", long) })
	limit := nameSlack + nameRatio*len(long)
	want := fmt.Sprintf("descriptor paths and limit labels add up to more than %d bytes (8 times the file's size plus 1 MiB): "+
		"a long key or value is repeated in the path of every descriptor below it", limit)
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 || list[0].Msg != want || list[0].Line < 5 {
		t.Fatalf("Parse(1000 children under a 64 KiB key) error = %v, want one problem at a child: %s", err, want)
	}
	// Without the bound the names alone would take 128 MB.
	if n > 4*uint64(limit) {
		t.Errorf("Parse(1000 children under a 64 KiB key) allocated %d bytes, want at most 4 times the bound on names (%d)", n, 4*limit)
	}
}

// TestWriteJSONBounded: whatever the cap, the dump is valid JSON of at
// most the cap plus its closing brackets, says when it is truncated, and
// is the whole dump when the cap allows.
func TestWriteJSONBounded(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("good.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	// Closing brackets of the deepest nesting, and the truncation note.
	const slack = 512
	for limit := 1; limit <= len(whole)+1; limit += 37 {
		var b bytes.Buffer
		if err := c.WriteJSON(&b, limit); err != nil {
			t.Fatalf("WriteJSON(cap %d): %v", limit, err)
		}
		out := b.Bytes()
		var dump struct {
			Domains   []json.RawMessage `json:"domains"`
			Truncated string            `json:"truncated"`
		}
		if err := json.Unmarshal(out, &dump); err != nil {
			t.Fatalf("WriteJSON(cap %d) is not valid JSON (%v):\n%s", limit, err, out)
		}
		if len(out) > limit+slack {
			t.Errorf("WriteJSON(cap %d) wrote %d bytes, want at most %d", limit, len(out), limit+slack)
		}
		if dump.Truncated == "" && !bytes.Equal(out, whole) {
			t.Errorf("WriteJSON(cap %d) is not the whole dump and has no truncation note:\n%s", limit, out)
		}
		if limit >= len(whole) && dump.Truncated != "" {
			t.Errorf("WriteJSON(cap %d) of a %d-byte dump is truncated: %q", limit, len(whole), dump.Truncated)
		}
	}
	var b bytes.Buffer
	if err := c.WriteJSON(&b, 300); err != nil || !strings.HasSuffix(b.String(), "\n  \"truncated\": \"the dump stops at its cap of 300 bytes; the rest of the config is left out\"\n}") {
		t.Errorf("WriteJSON(cap 300) = %v, ends %q; want the truncation note at the end", err, b.String()[max(0, b.Len()-120):])
	}
}

// TestWriteJSONStopsAtCap: a config whose dump is far bigger than the cap
// (100 descriptors with 16 KiB of metadata each) is written up to the cap,
// one item at a time: what it allocates depends on the cap, not on the
// config.
func TestWriteJSONStopsAtCap(t *testing.T) {
	text := strings.Repeat("x", 16<<10)
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 100 {
		fmt.Fprintf(&b, "  - {key: k%d, metadata: {text: %s}}\n", i, text)
	}
	c := parseString(t, b.String())
	const limit = 64 << 10 // three of the hundred texts
	var out bytes.Buffer
	out.Grow(limit + 1024)
	var err error
	n := allocated(func() { err = c.WriteJSON(&out, limit) })
	if err != nil || !json.Valid(out.Bytes()) || !strings.Contains(out.String(), `"truncated": `) || out.Len() > limit+512 {
		t.Errorf("WriteJSON(cap %d) of 100 × 16 KiB of metadata: %v, %d bytes, valid %v; want a truncated dump within the cap", limit, err, out.Len(), json.Valid(out.Bytes()))
	}
	if got := strings.Count(out.String(), text); got != 3 {
		t.Errorf("WriteJSON(cap %d) holds the 16 KiB text %d times, want 3", limit, got)
	}
	// Encoding an item takes a few copies of it; the whole dump (1.6 MB)
	// is never built.
	if n > 16*limit {
		t.Errorf("WriteJSON(cap %d) allocated %d bytes, want at most %d", limit, n, 16*limit)
	}
}
