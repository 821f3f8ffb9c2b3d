package config

import (
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

func entries(kv ...string) []Entry {
	out := []Entry{}
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}
