package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/service"
)

// Resetter answers POST /admin/reset; *service.Service implements it.
type Resetter interface {
	Reset(ctx context.Context, req *service.Request) (*service.ResetResult, error)
}

// maxAdminTokenBytes bounds the admin token file.
const maxAdminTokenBytes = 4096

// TokenFile is a bearer token kept in a file (--admin-token-file), read
// again whenever the file changes (its modification time or size), so
// that a rotated token applies at the next request. Safe for concurrent
// use.
type TokenFile struct {
	path string

	mu    sync.Mutex
	mod   time.Time
	size  int64
	token []byte
	err   error
}

// NewTokenFile reads the token of path: the file's content without
// surrounding white space, which must not be empty.
func NewTokenFile(path string) (*TokenFile, error) {
	t := &TokenFile{path: path}
	if _, err := t.current(); err != nil {
		return nil, err
	}
	return t, nil
}

// current returns the token, read again when the file changed. A file
// that became unreadable or empty refuses every token until it is mended.
func (t *TokenFile) current() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		t.token, t.err = nil, fmt.Errorf("admin token file: %w", err)
		t.mod, t.size = time.Time{}, -1
		return nil, t.err
	}
	if t.token != nil && fi.ModTime().Equal(t.mod) && fi.Size() == t.size {
		return t.token, nil
	}
	t.mod, t.size = fi.ModTime(), fi.Size()
	t.token, t.err = nil, nil
	switch b, err := os.ReadFile(t.path); {
	case err != nil:
		t.err = fmt.Errorf("admin token file: %w", err)
	case len(b) > maxAdminTokenBytes:
		t.err = fmt.Errorf("admin token file %s: more than %d bytes", t.path, maxAdminTokenBytes)
	case len(bytes.TrimSpace(b)) == 0:
		t.err = fmt.Errorf("admin token file %s is empty", t.path)
	default:
		t.token = bytes.TrimSpace(b)
	}
	return t.token, t.err
}

// admin guards an admin endpoint: loopback clients, and others with the
// bearer token of AdminToken. It passes next who is asking, for the log.
func (h *handler) admin(next func(w http.ResponseWriter, r *http.Request, who string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			next(w, r, "loopback "+r.RemoteAddr)
			return
		}
		if h.AdminToken == nil {
			h.refuse(r, "not loopback, no --admin-token-file")
			http.Error(w, "admin endpoints answer loopback clients only, or a bearer token with --admin-token-file", http.StatusForbidden)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		want, err := h.AdminToken.current()
		if err != nil {
			h.Logger.Error("admin endpoint: no token to compare with", "error", err)
		}
		if !ok || err != nil || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
			h.refuse(r, "no or wrong bearer token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="rls admin"`)
			http.Error(w, "admin endpoints want the bearer token of --admin-token-file", http.StatusUnauthorized)
			return
		}
		next(w, r, "token "+r.RemoteAddr)
	})
}

// refuse logs a refused admin request, at most once a second.
func (h *handler) refuse(r *http.Request, why string) {
	h.refused.Do(func() {
		h.Logger.Warn("admin request refused", "path", r.URL.Path, "from", r.RemoteAddr, "why", why)
	})
}

// reset answers POST /admin/reset: the body is a RateLimitRequest in
// proto3 JSON; every counter of the limits its descriptors match is
// cleared. The answer is the service's ResetResult in JSON, 200 (400 for
// a bad body, 501 when the store cannot reset).
func (h *handler) reset(w http.ResponseWriter, r *http.Request, who string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExplainBody))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	req, derr := envoyrls.DecodeJSON(body)
	if derr != nil {
		http.Error(w, derr.Error(), http.StatusBadRequest)
		return
	}
	res, err := h.Reset.Reset(r.Context(), req)
	if err != nil {
		status := envoyrls.HTTPStatus(err)
		if errors.Is(err, service.ErrCannotReset) {
			status = http.StatusNotImplemented
		}
		h.Logger.Error("admin reset failed", "by", who, "domain", req.Domain, "error", err)
		http.Error(w, err.Error(), status)
		return
	}
	var limits []string
	for _, d := range res.Descriptors {
		limits = append(limits, d.Limits...)
	}
	h.Logger.Info("admin reset", "by", who, "domain", res.Domain, "descriptors", res.Descriptors, "limits", limits, "cleared", res.Cleared)
	out, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(out, '\n'))
}
