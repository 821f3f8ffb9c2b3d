// Package deploy_test checks the files in deploy/ against a real rls: the
// Kubernetes manifests (built with kustomize, decoded strictly into the
// Kubernetes API types, their probes, ports, flags and limits run by a
// started rls), the Prometheus alert rules (parsed as Prometheus parses
// them, and loaded by a real Prometheus that scrapes a started rls and
// fires them) and the Grafana dashboard (every metric they query is one
// that a started rls exports, with the memory store and with Redis).
//
// deploy/ is a Go module of its own, so that rls's module does not carry
// Kubernetes, kustomize and Prometheus; it runs rls built from the
// repository (../cmd/rls, through internal/proctest), as the cluster would.
package deploy_test

import (
	"io"
	"net/http"
	"strings"
	"time"
)

// The processes the tests start (rls, built once for the whole run;
// redis-server; Prometheus) are internal/proctest's: this module requires
// rls's own (replace ../ in go.mod) for that package, which imports only
// the standard library.

// get answers the status and body of a GET.
func get(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	return body(c.Get(url))
}

// post answers the status and body of a POST of JSON.
func post(url, json string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	return body(c.Post(url, "application/json", strings.NewReader(json)))
}

func body(resp *http.Response, err error) (int, string, error) {
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
