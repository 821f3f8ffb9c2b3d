package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testPKI is a CA that signs server and client certificates for 127.0.0.1.
type testPKI struct {
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rls test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testPKI{caCert: cert, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), serial: 1}
}

// issue returns PEM certificate and key for cn, as a server or client cert.
func (p *testPKI) issue(t *testing.T, cn string, client bool) (certPEM, keyPEM []byte, serial int64) {
	t.Helper()
	p.serial++
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), p.serial
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t)
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
	certPEM, keyPEM, firstSerial := pki.issue(t, "rls", false)
	certFile, keyFile, caFile := write("tls.crt", certPEM), write("tls.key", keyPEM), write("ca.crt", pki.caPEM)
	clientCert, clientKey, _ := pki.issue(t, "envoy", true)
	cc, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.caPEM)

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
	certPEM, keyPEM, secondSerial := pki.issue(t, "rls", false)
	write("tls.key", keyPEM)
	write("tls.crt", certPEM)
	s.waitUntil(t, "the rotated certificate is served", func() bool {
		serial, err := servedSerial()
		return err == nil && serial == secondSerial
	})
}
