package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/rlsproject/rls/internal/testpki"
)

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	pki := testpki.New(t)
	caPEM, err := os.ReadFile(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p+".tmp", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM, firstSerial := pki.Issue(t, "rls", false)
	certFile, keyFile, caFile := write("tls.crt", certPEM), write("tls.key", keyPEM), write("ca.crt", caPEM)
	clientCert, clientKey, _ := pki.Issue(t, "envoy", true)
	cc, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)

	s := launch(t, nil, "--config", "../../config/limits.yaml", "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile)

	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cc}}}}
	servedSerial := func() (int64, error) {
		resp, err := httpClient.Get("https://" + s.httpAddr + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		httpClient.CloseIdleConnections()
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64(), nil
	}
	var serial int64
	s.waitUntil(t, "HTTPS /healthz with a client certificate", func() bool {
		serial, err = servedSerial()
		return err == nil
	})
	if serial != firstSerial {
		t.Fatalf("served certificate serial %d, want %d", serial, firstSerial)
	}

	// gRPC with a client certificate works; without one the handshake fails.
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cc}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), rlRequest("api", "remote_address", "1.2.3.4")); err != nil {
		t.Errorf("gRPC over mutual TLS: %v", err)
	}
	anon, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer ccancel()
	if _, err := rlsv3.NewRateLimitServiceClient(anon).ShouldRateLimit(cctx, rlRequest("api", "remote_address", "1.2.3.4")); err == nil {
		t.Error("gRPC without a client certificate succeeded, want the handshake refused")
	}

	// rls check speaks TLS with a client certificate too.
	clientCertFile, clientKeyFile := write("client.crt", clientCert), write("client.key", clientKey)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "--tls-ca", caFile, "--tls-cert", clientCertFile, "--tls-key", clientKeyFile, "api", "remote_address=1.2.3.5"}, nil, &out, io.Discard); err != nil || !strings.HasPrefix(out.String(), "1 OK:") {
		t.Errorf("rls check over mutual TLS = %v, %q; want one OK line", err, out.String())
	}
	if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "--tls-ca", caFile, "api", "remote_address=1.2.3.5"}, nil, io.Discard, io.Discard); exitCode(err) != checkFailed {
		t.Errorf("rls check without a client certificate = %v (exit %d), want exit %d", err, exitCode(err), checkFailed)
	}

	// Rotate the certificate on disk: new handshakes get the new one.
	certPEM, keyPEM, secondSerial := pki.Issue(t, "rls", false)
	write("tls.key", keyPEM)
	write("tls.crt", certPEM)
	s.waitUntil(t, "the rotated certificate is served", func() bool {
		serial, err := servedSerial()
		return err == nil && serial == secondSerial
	})
}
