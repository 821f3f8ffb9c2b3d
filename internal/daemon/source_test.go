package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileSourceSkipsTestFiles: a config directory that holds an rls test
// file beside the limits it tests starts the server, and the log says
// which file the load passed over.
func TestFileSourceSkipsTestFiles(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"limits.yaml":      "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"limits_test.yaml": "domain: api\ntests:\n  - name: one\n    steps: [{descriptors: [k=v], expect: OK}]\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	cfg, err := NewFileSource(Files{Path: dir}).Initial(slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("Initial(a directory with a test file) = %v", err)
	}
	if cfg.Domain("api") == nil {
		t.Errorf("Initial: domains %v, want api", cfg.Domains())
	}
	want := "skipped a test file of rls test (tests: and no descriptors:)\" file=" + filepath.Join(dir, "limits_test.yaml")
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log:\n%s\nwant a line with %s", logs.String(), want)
	}
}
