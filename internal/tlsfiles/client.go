package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ClientFiles name the PEM files of the client's side of a TLS connection.
type ClientFiles struct {
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

// Client returns the TLS config of f. The files are read once here, so
// that a missing or bad file is a start-up error.
func Client(f ClientFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := LoadPool(f.CA)
		if err != nil {
			return nil, fmt.Errorf("server CA: %w", err)
		}
		cfg.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("client certificate: a certificate and a key go together")
	}
	if f.Cert != "" {
		load := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
			if err != nil {
				return nil, fmt.Errorf("client certificate %s / key %s: %w", f.Cert, f.Key, err)
			}
			return &c, nil
		}
		if _, err := load(nil); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = load
	}
	return cfg, nil
}

// LoadPool reads the PEM certificates of a CA file into a pool.
func LoadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
