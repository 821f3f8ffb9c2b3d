package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// The URLs rls healthcheck asks by default: rls's /readyz on its default
// HTTP port, over TLS when a TLS flag is given.
const (
	defaultHealthURL    = "http://127.0.0.1:8080/readyz"
	defaultHealthURLTLS = "https://127.0.0.1:8080/readyz"
)

func newHealthcheckFlagSet() (*flag.FlagSet, *tlsClientFlags) {
	fs := flag.NewFlagSet("rls healthcheck", flag.ContinueOnError)
	f := &tlsClientFlags{}
	f.define(fs)
	return fs, f
}

func healthcheckDetails(w io.Writer) {
	fmt.Fprint(w, `Asks URL (default `+defaultHealthURL+`, or `+defaultHealthURLTLS+` with a
TLS flag) and exits 0 when it answers 200, 1 otherwise: for container health checks in an
image that has no curl or wget. An https:// URL is verified against --tls-ca (default: the
system's roots), for the name of --tls-server-name (default: the URL's host); --tls-cert and
--tls-key present a client certificate to a listener that requires one (--tls-client-ca).

  rls healthcheck
  rls healthcheck --tls-ca /etc/rls/ca.crt --tls-cert /etc/rls/tls.crt --tls-key /etc/rls/tls.key \
    --tls-server-name rls.internal

flags:
`)
	fs, _ := newHealthcheckFlagSet()
	printFlags(w, fs, nil, false)
}

// healthcheck asks a readiness URL, for container health checks in an
// image that has no curl or wget.
func healthcheck(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newHealthcheckFlagSet()
	if err := commandFlags("healthcheck", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	target := defaultHealthURL
	if f.on() {
		target = defaultHealthURLTLS
	}
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		return usageError{errors.New("usage: rls healthcheck [flags] [URL]")}
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{fmt.Errorf("healthcheck: %q is not an http:// or https:// URL", target)}
	}
	if u.Scheme == "http" && f.on() {
		return usageError{fmt.Errorf("healthcheck: %s is plain HTTP, and a TLS flag is given: use https://", target)}
	}
	client := &http.Client{}
	if u.Scheme == "https" {
		cfg, err := f.config()
		if err != nil {
			return usageError{fmt.Errorf("healthcheck: %w", err)}
		}
		client.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	defer client.CloseIdleConnections() // one request: keep no connection (nor its goroutines) past run
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", target, resp.Status, body)
	}
	fmt.Fprintf(stdout, "%s: %s", target, body)
	return nil
}
