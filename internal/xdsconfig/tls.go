package xdsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles name the PEM files of the client's side of a TLS connection to
// the management server.
type TLSFiles struct {
	// CA signs the server's certificate; empty means the system's roots.
	CA string
	// Cert and Key, when set, are the client certificate (mutual TLS). They
	// are read at every handshake, so a rotated certificate is used from
	// the next connection on.
	Cert, Key string
	// ServerName is the name the server's certificate must carry (its
	// SAN); empty means the host of the server's address.
	ServerName string
}

// ClientTLS returns the TLS config of f. The files are read once here, so
// that a missing or bad file is a start-up error.
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("xDS server CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xDS server CA %s: no PEM certificate in it", f.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("xDS client certificate: a certificate and a key go together")
	}
	if f.Cert != "" {
		if _, err := tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
			return nil, fmt.Errorf("xDS client certificate %s / key %s: %w", f.Cert, f.Key, err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
			if err != nil {
				return nil, fmt.Errorf("xDS client certificate %s / key %s: %w", f.Cert, f.Key, err)
			}
			return &c, nil
		}
	}
	return cfg, nil
}
