package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestValidateConfigDirectoryWithTestFiles: the repository's config
// directory, where each limits file has its rls test file beside it (as
// the README recommends), validates: every domain ok, each test file
// reported as skipped; and rls test takes the directory as its config.
func TestValidateConfigDirectoryWithTestFiles(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"validate", "../../config"}, nil, &out, io.Discard); err != nil {
		t.Fatalf("rls validate config/ = %v:\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"api: ok: ",
		"uploads: ok: ",
		"../../config/limits_test.yaml: skipped: a test file of rls test (tests: and no descriptors:)\n",
		"../../config/examples/concurrency_test.yaml: skipped: ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rls validate config/ printed\n%s\nwant a line with %q", got, want)
		}
	}

	out.Reset()
	err := run(context.Background(), []string{"test", "../../config", "../../config/limits_test.yaml"}, nil, &out, io.Discard)
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); err != nil || !strings.HasSuffix(lines[len(lines)-1], " passed, 0 failed") {
		t.Errorf("rls test config/ config/limits_test.yaml = %v:\n%s", err, out.String())
	}
}
