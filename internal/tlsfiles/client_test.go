package tlsfiles

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/testpki"
)

// serveTLS serves TLS handshakes with the certificate certPEM/keyPEM on a
// loopback port until the test ends, and returns its address.
func serveTLS(t *testing.T, certPEM, keyPEM []byte) string {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.(*tls.Conn).Handshake() // the client's verdict is what the test reads
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestSkipHostnameVerifiesTheChainOnly: with SkipHostname, a server whose
// certificate names another host is accepted when its CA is trusted, and
// refused when it is not; without it, the name is checked.
func TestSkipHostnameVerifiesTheChainOnly(t *testing.T) {
	pki := testpki.New(t)
	certPEM, keyPEM, _ := pki.IssueFor(t, "redis", false, "redis.elsewhere.example")
	addr := serveTLS(t, certPEM, keyPEM)
	for _, tc := range []struct {
		name    string
		files   ClientFiles
		wantErr string // "" for a handshake that succeeds
	}{
		{"the CA, names checked", ClientFiles{CA: pki.CA}, "cannot validate certificate for 127.0.0.1"},
		{"the CA, names not checked", ClientFiles{CA: pki.CA, SkipHostname: true}, ""},
		{"another CA, names not checked", ClientFiles{CA: pki.OtherCA, SkipHostname: true}, "unknown authority"},
		{"the system's roots, names not checked", ClientFiles{SkipHostname: true}, "unknown authority"},
		{"the CA and a client certificate, names not checked", ClientFiles{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, SkipHostname: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Client(tc.files)
			if err != nil {
				t.Fatal(err)
			}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
			if err == nil {
				c.Close()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("handshake with a certificate for redis.elsewhere.example: %v, want success", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("handshake with a certificate for redis.elsewhere.example: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestSkipHostnameSurvivesClone: go-redis clones the config per connection;
// the chain is still verified on the clone.
func TestSkipHostnameSurvivesClone(t *testing.T) {
	pki := testpki.New(t)
	certPEM, keyPEM, _ := pki.IssueFor(t, "redis", false, "redis.elsewhere.example")
	addr := serveTLS(t, certPEM, keyPEM)
	cfg, err := Client(ClientFiles{CA: pki.OtherCA, SkipHostname: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.Dial("tcp", addr, cfg.Clone()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("a cloned config with SkipHostname and a CA that signed nothing: %v, want an unknown-authority error", err)
	}
}

func TestClientBadFiles(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("no PEM here"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		files ClientFiles
		want  string
	}{
		{ClientFiles{CA: junk}, "junk.pem: no PEM certificate in it"},
		{ClientFiles{CA: filepath.Join(dir, "missing.pem")}, "missing.pem"},
		{ClientFiles{Cert: junk}, "a certificate and a key go together"},
	} {
		if _, err := Client(tc.files); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Client(%+v) = %v, want an error containing %q", tc.files, err, tc.want)
		}
	}
}
