package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"

	"github.com/rlsproject/rls/internal/tlsfiles"
)

// tlsClientFlags are the TLS flags of a command that connects to rls (rls
// check, rls healthcheck): the CA that signs rls's certificate and a
// client certificate for a listener that requires one.
type tlsClientFlags struct {
	caFile, certFile, keyFile, serverName string
}

// define defines --tls-ca, --tls-cert, --tls-key and --tls-server-name on
// fs.
func (f *tlsClientFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.caFile, "tls-ca", "", "PEM CA `file`: connect with TLS, trusting this CA")
	fs.StringVar(&f.certFile, "tls-cert", "", "PEM client certificate `file`, for a server that requires one (with --tls-key)")
	fs.StringVar(&f.keyFile, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&f.serverName, "tls-server-name", "", "the `name` rls's certificate must carry (default: the host connected to); for a certificate that does not name 127.0.0.1")
}

// on reports whether a TLS flag is set.
func (f *tlsClientFlags) on() bool {
	return f.caFile != "" || f.certFile != "" || f.keyFile != "" || f.serverName != ""
}

// config returns the TLS config of the flags.
func (f *tlsClientFlags) config() (*tls.Config, error) {
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: f.caFile, Cert: f.certFile, Key: f.keyFile, ServerName: f.serverName})
	if err != nil {
		return nil, fmt.Errorf("--tls-ca, --tls-cert, --tls-key: %w", err)
	}
	return cfg, nil
}
