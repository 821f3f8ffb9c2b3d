// Package tlsfiles builds server TLS configs from PEM files that are
// re-read when they change on disk, so that certificates can be rotated
// (cert-manager, Vault agents) without restarting the server, and client
// TLS configs whose certificate is read at every handshake. It knows
// nothing about the connections that use the configs.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of a server.
type Files struct {
	Cert, Key string
	// ClientCA, when set, makes the server require client certificates
	// signed by one of its CAs (mutual TLS).
	ClientCA string
}

// Source serves the current certificate and client CA pool, re-reading the
// files at most once per CheckEvery when their modification time or size
// changed. A failed re-read keeps the previous material and is logged. Safe
// for concurrent use.
type Source struct {
	files      Files
	log        *slog.Logger
	checkEvery time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	pool    *x509.CertPool
	stamp   string
	checked time.Time
}

// New loads the files once; an error here is a start-up error.
func New(files Files, log *slog.Logger) (*Source, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, log: log, checkEvery: time.Second}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// stampOf identifies the files' current versions.
func (s *Source) stampOf() string {
	var b []byte
	for _, f := range []string{s.files.Cert, s.files.Key, s.files.ClientCA} {
		if f == "" {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			b = fmt.Appendf(b, "%s:missing;", f)
			continue
		}
		b = fmt.Appendf(b, "%s:%d:%d;", f, st.ModTime().UnixNano(), st.Size())
	}
	return string(b)
}

// load reads the files. Requires s.mu held or exclusive access.
func (s *Source) load() error {
	stamp := s.stampOf()
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("TLS certificate %s / key %s: %w", s.files.Cert, s.files.Key, err)
	}
	var pool *x509.CertPool
	if s.files.ClientCA != "" {
		if pool, err = LoadPool(s.files.ClientCA); err != nil {
			return fmt.Errorf("TLS client CA: %w", err)
		}
	}
	s.cert, s.pool, s.stamp = &cert, pool, stamp
	return nil
}

// current returns the material, re-reading it when the files changed.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.checked) >= s.checkEvery {
		s.checked = now
		if st := s.stampOf(); st != s.stamp {
			if err := s.load(); err != nil {
				s.log.Error("TLS files changed but cannot be loaded; serving the previous certificate", "error", err)
				s.stamp = st // do not retry until they change again
			} else {
				s.log.Info("TLS certificate reloaded", "cert", s.files.Cert)
			}
		}
	}
	return s.cert, s.pool
}

// Config returns a server config that asks the Source on every handshake.
func (s *Source) Config() *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool := s.current()
		c := &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{*cert},
			NextProtos:   []string{"h2", "http/1.1"},
		}
		if pool != nil {
			c.ClientCAs = pool
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	return base
}
