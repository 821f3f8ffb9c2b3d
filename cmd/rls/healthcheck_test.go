package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/testpki"
)

// TestHealthcheckTLS: rls healthcheck checks an HTTPS listener that
// requires client certificates (mutual TLS): it verifies rls against
// --tls-ca, for --tls-server-name when the certificate does not name the
// address, and presents --tls-cert and --tls-key. It used to speak plain
// HTTP with the system's roots only, and could not check such a listener.
func TestHealthcheckTLS(t *testing.T) {
	dir := t.TempDir()
	pki := testpki.New(t)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// rls's certificate names rls.internal only, not 127.0.0.1.
	certPEM, keyPEM, _ := pki.IssueFor(t, "rls", false, "rls.internal")
	certFile, keyFile := write("tls.crt", certPEM), write("tls.key", keyPEM)
	clientPEM, clientKeyPEM, _ := pki.Issue(t, "docker", true)
	clientCert, clientKey := write("client.crt", clientPEM), write("client.key", clientKeyPEM)
	s := launch(t, nil, "--config", "../../config/limits.yaml", "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", pki.CA)
	url := "https://" + s.httpAddr + "/readyz"
	good := []string{"--tls-ca", pki.CA, "--tls-cert", clientCert, "--tls-key", clientKey, "--tls-server-name", "rls.internal"}
	healthcheck := func(args ...string) (string, error) {
		var out strings.Builder
		err := run(context.Background(), append([]string{"healthcheck"}, args...), nil, &out, io.Discard)
		return out.String(), err
	}
	s.waitUntil(t, "rls is ready over mutual TLS", func() bool {
		_, err := healthcheck(append(good, url)...)
		return err == nil
	})
	if out, err := healthcheck(append(good, url)...); err != nil || !strings.Contains(out, url+": ok") {
		t.Errorf("rls healthcheck %q = %q, %v; want %s: ok", append(good, url), out, err, url)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no client certificate", []string{"--tls-ca", pki.CA, "--tls-server-name", "rls.internal", url}, 1, "certificate"},
		{"another CA", []string{"--tls-ca", pki.OtherCA, "--tls-cert", clientCert, "--tls-key", clientKey, "--tls-server-name", "rls.internal", url}, 1, "certificate"},
		{"not the name of the certificate", []string{"--tls-ca", pki.CA, "--tls-cert", clientCert, "--tls-key", clientKey, url}, 1, "doesn't contain any IP SANs"},
		{"plain HTTP to a TLS listener", []string{"http://" + s.httpAddr + "/readyz"}, 1, "400"},
		{"a TLS flag and an http:// URL", []string{"--tls-ca", pki.CA, "http://" + s.httpAddr + "/readyz"}, 2, "plain HTTP, and a TLS flag is given"},
		{"a certificate without its key", []string{"--tls-ca", pki.CA, "--tls-cert", clientCert, url}, 2, "--tls-cert and --tls-key go together"},
		{"not a URL", []string{"127.0.0.1:8080"}, 2, "is not an http:// or https:// URL"},
	} {
		_, err := healthcheck(tc.args...)
		if err == nil || exitCode(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: rls healthcheck %q = %v (exit %d), want exit %d and %q", tc.name, tc.args, err, exitCode(err), tc.code, tc.want)
		}
	}
}
