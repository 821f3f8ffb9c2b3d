package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// Helpers shared by the package's tests.

// parseString parses one file's text, failing the test on error.
func parseString(t *testing.T, text string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(text))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror:\n%v", text, err)
	}
	return c
}

// writeFiles creates files (name → contents) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func domainDoc(name string) string {
	return "domain: " + name + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
}

// fakeRequest is an HTTPRequest with fixed headers (lower-case names) and
// client address.
type fakeRequest struct {
	headers map[string]string
	addr    netip.Addr
}

func (r fakeRequest) Header(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r fakeRequest) ClientAddr() netip.Addr { return r.addr }

func req(addr string, kv ...string) fakeRequest {
	r := fakeRequest{headers: map[string]string{}}
	if addr != "" {
		r.addr = netip.MustParseAddr(addr)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		r.headers[kv[i]] = kv[i+1]
	}
	return r
}

func entries(kv ...string) []Entry {
	out := []Entry{}
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// globMatch is a plain recursive reference for '*' patterns.
func globMatch(p, s string) bool {
	if p == "" {
		return s == ""
	}
	if p[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if globMatch(p[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	return s != "" && s[0] == p[0] && globMatch(p[1:], s[1:])
}
