// Package testpki makes throw-away PKIs for tests: a CA, a certificate it
// signed for 127.0.0.1 and localhost (servers and clients alike: Redis over
// TLS, an xDS server and its clients), and a CA that signed nothing.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA and one certificate it signed for 127.0.0.1 and localhost,
// good for servers and clients alike (as the certificate Envoy Gateway gives
// its rate-limit deployment: tls.crt, tls.key, ca.crt), as PEM files; and a
// second CA that signed nothing here, for a client or server to distrust.
type PKI struct {
	CA, Cert, Key string
	OtherCA       string

	caKey  *ecdsa.PrivateKey // for Issue
	caCert *x509.Certificate
	serial int64 // the last serial number used
}

// New writes a PKI into a temporary directory.
func New(tb testing.TB) *PKI {
	tb.Helper()
	dir := tb.TempDir()
	caKey, caCert, caDER := newCA(tb, "testpki CA")
	_, _, otherDER := newCA(tb, "testpki other CA")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy-ratelimit"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost", "envoy-gateway"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	p := &PKI{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), OtherCA: filepath.Join(dir, "other-ca.crt"),
		caKey: caKey, caCert: caCert, serial: 2}
	for path, block := range map[string]*pem.Block{
		p.CA:      {Type: "CERTIFICATE", Bytes: caDER},
		p.Cert:    {Type: "CERTIFICATE", Bytes: der},
		p.Key:     {Type: "EC PRIVATE KEY", Bytes: kder},
		p.OtherCA: {Type: "CERTIFICATE", Bytes: otherDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return p
}

// Issue signs another certificate for 127.0.0.1 with p's CA, for cn, as a
// server's (or, with client, a client's), and returns it and its key as
// PEM, with its serial number (each Issue a new one: a rotated
// certificate can be told from the one before).
func (p *PKI) Issue(tb testing.TB, cn string, client bool) (certPEM, keyPEM []byte, serial int64) {
	tb.Helper()
	return p.IssueFor(tb, cn, client, "127.0.0.1")
}

// IssueFor is Issue for hosts (IP addresses or DNS names) instead of
// 127.0.0.1: a certificate that names another host than the one it is
// served from, say.
func (p *PKI) IssueFor(tb testing.TB, cn string, client bool, hosts ...string) (certPEM, keyPEM []byte, serial int64) {
	tb.Helper()
	p.serial++
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), p.serial
}

func newCA(tb testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	tb.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return key, cert, der
}

// ServerTLS returns a server TLS config from p's certificate that requires
// client certificates signed by p's CA.
func (p *PKI) ServerTLS(tb testing.TB) *tls.Config {
	tb.Helper()
	cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		tb.Fatal(err)
	}
	pem, err := os.ReadFile(p.CA)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}
