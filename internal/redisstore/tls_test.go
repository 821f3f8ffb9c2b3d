package redisstore

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

// TestTLSSkipHostname: a TLS Redis whose certificate names another host
// (redis.elsewhere.example, reached at 127.0.0.1) is refused by default,
// answers with TLSSkipHostname when its CA is trusted (with a warning in
// the log), and is still refused with TLSSkipHostname when its CA is not.
func TestTLSSkipHostname(t *testing.T) {
	pki := testpki.New(t)
	certPEM, keyPEM, _ := pki.IssueFor(t, "redis", false, "redis.elsewhere.example")
	dir := t.TempDir()
	elsewhere := &testpki.PKI{CA: pki.CA, Cert: filepath.Join(dir, "redis.crt"), Key: filepath.Join(dir, "redis.key")}
	for path, pem := range map[string][]byte{elsewhere.Cert: certPEM, elsewhere.Key: keyPEM} {
		if err := os.WriteFile(path, pem, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv := redistest.StartWith(t, redistest.Config{TLS: elsewhere})
	url := "rediss://" + srv.Addr() + "/0"
	for _, tc := range []struct {
		name    string
		opts    Options
		wantErr string // "" for a Ping that succeeds
	}{
		{"host name checked", Options{CAFile: pki.CA}, "doesn't contain any IP SANs"},
		{"host name not checked", Options{CAFile: pki.CA, TLSSkipHostname: true}, ""},
		{"host name not checked, CA not trusted", Options{CAFile: pki.OtherCA, TLSSkipHostname: true}, "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs servetest.SyncBuffer
			tc.opts.URL, tc.opts.Timeout, tc.opts.Logger = url, time.Second, slog.New(slog.NewTextHandler(&logs, nil))
			s := newStore(t, tc.opts)
			err := s.Ping(context.Background())
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Ping = %v, want success", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Ping = %v, want an error containing %q", err, tc.wantErr)
			}
			if warned := strings.Contains(logs.String(), "not that it names the host"); warned != tc.opts.TLSSkipHostname {
				t.Errorf("warning logged %v, want %v; log:\n%s", warned, tc.opts.TLSSkipHostname, logs.String())
			}
		})
	}
	if _, err := New(Options{URL: "redis://" + srv.Addr() + "/0", TLSSkipHostname: true}); err == nil || !strings.Contains(err.Error(), "not rediss://") {
		t.Errorf("TLSSkipHostname with a redis:// URL: %v, want an error", err)
	}
}
