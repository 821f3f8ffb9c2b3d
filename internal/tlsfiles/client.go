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
	// SkipHostname verifies the server's certificate chain (against CA, or
	// the system's roots) but not that the certificate names the server:
	// for servers reached by addresses that their certificates do not
	// carry (a Redis master that Sentinel reports by its IP address). This
	// is what envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
	// does. Anyone holding a certificate of that CA can then pose as the
	// server.
	SkipHostname bool
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
	if f.SkipHostname {
		// Go's own verification checks the name too: it is turned off, and
		// the chain is verified here, without a name.
		cfg.InsecureSkipVerify = true
		roots := cfg.RootCAs
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyChain(cs.PeerCertificates, roots) }
	}
	return cfg, nil
}

// verifyChain verifies that certs (the server's certificate, then the
// intermediates it sent) chain up to roots (nil: the system's) for server
// authentication, whatever host they name.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool) error {
	if len(certs) == 0 {
		return errors.New("tls: the server sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("tls: server certificate (its host name not checked): %w", err)
	}
	return nil
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
