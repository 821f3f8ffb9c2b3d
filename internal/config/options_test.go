package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/engine"
)

// TestTolerateKeys: keys the caller names are ignored with a warning where
// their level has no such key; other misplaced keys are still errors, and
// without a reason the warning ends with the place.
func TestTolerateKeys(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"f.yaml": "domain: d\nowner: team-a\ndescriptors:\n  - key: k\n    owner: team-b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	c, err := LoadWith(LoadOptions{Parse: ParseOptions{TolerateKeys: []string{"owner"}}}, dir)
	if err != nil {
		t.Fatalf("LoadWith(TolerateKeys: owner): %v", err)
	}
	var warns []string
	for _, w := range c.Warnings() {
		warns = append(warns, fmt.Sprintf("%s:%d:%d: %s", filepath.Base(w.File), w.Line, w.Column, w.Msg))
	}
	want := `f.yaml:2:1: key "owner" is ignored at the top of a document` + "\n" +
		`f.yaml:5:5: descriptor "k": key "owner" is ignored in a descriptor`
	if got := strings.Join(warns, "\n"); got != want {
		t.Errorf("warnings:\n%s\nwant:\n%s", got, want)
	}
	if n := c.Domain("d").Match([]Entry{{Key: "k", Value: "v"}}); n == nil || len(n.Limits) != 1 || n.Limits[0].Rule.Limit != 1 || n.Limits[0].Rule.Unit != engine.Second {
		t.Errorf("k=v matched %+v, want a node with a limit of 1 per second", n)
	}

	writeFiles(t, dir, map[string]string{"f.yaml": "domain: d\ndescriptors:\n  - key: k\n    unit: second\n"})
	_, err = LoadWith(LoadOptions{Parse: ParseOptions{TolerateKeys: []string{"owner"}, TolerateReason: "why"}}, dir)
	if err == nil || !strings.Contains(err.Error(), `key "unit" is not allowed in a descriptor (it belongs in a rate_limit)`) {
		t.Errorf("a misplaced key not tolerated: err = %v", err)
	}
	if c, err := Parse("f.yaml", []byte("domain: d\n")); err != nil || c.Warnings() != nil {
		t.Errorf("rls's own rules: %v, warnings %v; want none", err, c.Warnings())
	}
}
