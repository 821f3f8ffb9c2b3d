package httpapi

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// t0 is the instant the token file tests start at.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// TestParseToken: a token file is one non-empty line; white space around
// it (a trailing newline, a CRLF, blank lines) does not count.
func TestParseToken(t *testing.T) {
	for _, tc := range []struct {
		content, want, wantErr string
	}{
		{"s3cret", "s3cret", ""},
		{"s3cret\n", "s3cret", ""},
		{"s3cret\r\n", "s3cret", ""},
		{"\n  s3cret  \n\n", "s3cret", ""},
		{"", "", "no token in it"},
		{"\n \n", "", "no token in it"},
		{"s3cret\nother\n", "", "line 2: a second non-empty line"},
		{"s3cret\n\nother", "", "line 3: a second non-empty line"},
		{strings.Repeat("x", 4097), "", "more than 4096 bytes"},
	} {
		got, err := ParseToken([]byte(tc.content))
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseToken(%q) = %q, %v; want error %q", tc.content, got, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || string(got) != tc.want):
			t.Errorf("ParseToken(%q) = %q, %v; want %q", tc.content, got, err, tc.want)
		}
	}
}

// tokenTimeline is a token file, its TokenFile and its log, for a step
// table.
type tokenTimeline struct {
	t    *testing.T
	path string
	tf   *TokenFile
	logs *bytes.Buffer
}

func newTokenTimeline(t *testing.T, content string, mode os.FileMode) *tokenTimeline {
	t.Helper()
	tl := &tokenTimeline{t: t, path: filepath.Join(t.TempDir(), "token"), logs: &bytes.Buffer{}}
	tl.write(content, mode)
	tf, err := NewTokenFile(tl.path, slog.New(slog.NewTextHandler(tl.logs, nil)))
	if err != nil {
		t.Fatalf("NewTokenFile(%q): %v", content, err)
	}
	tl.tf = tf
	return tl
}

func (tl *tokenTimeline) write(content string, mode os.FileMode) {
	tl.t.Helper()
	if err := os.WriteFile(tl.path, []byte(content), mode); err != nil {
		tl.t.Fatal(err)
	}
	if err := os.Chmod(tl.path, mode); err != nil { // WriteFile keeps an existing file's mode
		tl.t.Fatal(err)
	}
}

// expect checks which tokens are valid now, and the log lines of a level
// written since the last expect.
func (tl *tokenTimeline) expect(step string, valid, invalid []string, level string, lines int) {
	tl.t.Helper()
	for _, tok := range valid {
		if !tl.tf.valid(tok) {
			tl.t.Errorf("%s: valid(%q) = false, want true", step, tok)
		}
	}
	for _, tok := range invalid {
		if tl.tf.valid(tok) {
			tl.t.Errorf("%s: valid(%q) = true, want false", step, tok)
		}
	}
	logs := tl.logs.String()
	if n := strings.Count(logs, "level="+level); n != lines {
		tl.t.Errorf("%s: %d %s log lines, want %d:\n%s", step, n, level, lines, logs)
	}
	tl.logs.Reset()
}

// TestTokenFileSameLengthRotationWithOldMtime: a token of the same length
// written with the file's old modification time is taken at the next
// check (the content is compared, not the modification time and size).
func TestTokenFileSameLengthRotationWithOldMtime(t *testing.T) {
	tl := newTokenTimeline(t, "s3cret\n", 0o600)
	fi, err := os.Stat(tl.path)
	if err != nil {
		t.Fatal(err)
	}
	tl.write("n3wtok\n", 0o600)
	if err := os.Chtimes(tl.path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	tl.tf.Check(t0)
	tl.expect("after a same-length rotation with the old mtime", []string{"n3wtok"}, []string{"s3cret"}, "INFO", 1)
	tl.tf.Check(t0.Add(time.Second))
	tl.expect("the same content again", []string{"n3wtok"}, []string{"s3cret"}, "INFO", 0)
}

// TestTokenFileMissingLogsBounded: a token file that goes missing refuses
// every token and logs one error when it goes, then one a minute while it
// stays missing, whatever the number of checks or requests; when it comes
// back its token is in force again.
func TestTokenFileMissingLogsBounded(t *testing.T) {
	tl := newTokenTimeline(t, "s3cret\n", 0o600)
	if err := os.Remove(tl.path); err != nil {
		t.Fatal(err)
	}
	for i := range 100 { // checks a second apart: 100 s
		tl.tf.Check(t0.Add(time.Duration(i) * time.Second))
	}
	tl.expect("100 checks over 100 s of a missing file", nil, []string{"s3cret", ""}, "ERROR", 2)
	tl.write("s3cret\n", 0o600)
	tl.tf.Check(t0.Add(100 * time.Second))
	tl.expect("the file back", []string{"s3cret"}, nil, "INFO", 1)
}

// TestTokenFileBadContentOnReload: a second line written into the file is
// refused and keeps the token in force (logged when it appears, then once
// a minute); an emptied file refuses every token; a file mended takes its
// token.
func TestTokenFileBadContentOnReload(t *testing.T) {
	tl := newTokenTimeline(t, "s3cret\n", 0o600)
	tl.write("s3cret\nn3wtok\n", 0o600)
	for i := range 30 {
		tl.tf.Check(t0.Add(time.Duration(i) * time.Second))
	}
	tl.expect("two lines, checked for 30 s", []string{"s3cret"}, []string{"n3wtok", "s3cret\nn3wtok"}, "ERROR", 1)
	tl.tf.Check(t0.Add(time.Minute))
	tl.expect("two lines, a minute on", []string{"s3cret"}, nil, "ERROR", 1)
	tl.write("\n", 0o600)
	tl.tf.Check(t0.Add(time.Minute + time.Second))
	tl.expect("emptied", nil, []string{"s3cret", ""}, "ERROR", 1)
	tl.write("n3wtok\n", 0o600)
	tl.tf.Check(t0.Add(time.Minute + 2*time.Second))
	tl.expect("mended", []string{"n3wtok"}, []string{"s3cret"}, "ERROR", 0)
}

// TestTokenFileTwoLinesAtStart: a file of two non-empty lines is an error
// at start (it used to be taken whole, and no bearer token could match it).
func TestTokenFileTwoLinesAtStart(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ content, wantErr string }{
		{"a\nb\n", "line 2: a second non-empty line"},
		{"\n\n", "no token in it"},
	} {
		path := filepath.Join(dir, "token")
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := NewTokenFile(path, nil); err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), path) {
			t.Errorf("NewTokenFile of %q = %v, want an error naming the file and %q", tc.content, err, tc.wantErr)
		}
	}
	if _, err := NewTokenFile(filepath.Join(dir, "missing"), nil); err == nil {
		t.Errorf("NewTokenFile of a missing file: no error")
	}
}

// TestTokenFileWorldReadableWarnsOnce: a token file that its group or
// others may read is warned about once, at start or at the first check
// that sees it so.
func TestTokenFileWorldReadableWarnsOnce(t *testing.T) {
	tl := newTokenTimeline(t, "s3cret\n", 0o644)
	tl.expect("started with mode 0644", []string{"s3cret"}, nil, "WARN", 1)
	tl.tf.Check(t0)
	tl.write("n3wtok\n", 0o644)
	tl.tf.Check(t0.Add(time.Second))
	tl.expect("checked twice more", []string{"n3wtok"}, nil, "WARN", 0)

	tl = newTokenTimeline(t, "s3cret\n", 0o600)
	tl.expect("started with mode 0600", nil, nil, "WARN", 0)
	tl.write("s3cret\n", 0o640)
	tl.tf.Check(t0)
	tl.tf.Check(t0.Add(time.Second))
	tl.expect("chmod 640", []string{"s3cret"}, nil, "WARN", 1)
}

// TestBearerSchemeAnyCase: the Bearer scheme is read in any case (RFC
// 7235), with the token after one or more spaces.
func TestBearerSchemeAnyCase(t *testing.T) {
	for _, tc := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer s3cret", "s3cret", true},
		{"bearer s3cret", "s3cret", true},
		{"BEARER s3cret", "s3cret", true},
		{"Bearer   s3cret ", "s3cret", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearers3cret", "", false},
		{"Basic s3cret", "", false},
		{"", "", false},
	} {
		if token, ok := bearer(tc.header); token != tc.token || ok != tc.ok {
			t.Errorf("bearer(%q) = %q, %t; want %q, %t", tc.header, token, ok, tc.token, tc.ok)
		}
	}
}
