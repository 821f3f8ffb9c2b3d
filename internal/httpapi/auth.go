package httpapi

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rlsproject/rls/internal/clientip"
	"github.com/rlsproject/rls/internal/service"
)

// AuthOptions configure /auth/{domain}.
type AuthOptions struct {
	// TrustedProxies, when not empty, are the only peers whose
	// X-Forwarded-For (else X-Real-IP) is believed; the client is then the
	// right-most X-Forwarded-For hop that is not itself a trusted proxy. When
	// empty,
	// every peer is trusted (the endpoint is meant for the proxy only) and
	// the client is X-Real-IP, else the first X-Forwarded-For hop, else the
	// peer.
	TrustedProxies []netip.Prefix
}

// auth is the forward-auth endpoint for nginx auth_request (and Traefik or
// Caddy forward auth).
func (h *handler) auth(w http.ResponseWriter, r *http.Request) {
	denyStatus := http.StatusTooManyRequests
	if ds := r.URL.Query().Get("deny_status"); ds != "" {
		switch ds {
		case "401", "403", "429":
			denyStatus, _ = strconv.Atoi(ds)
		default:
			http.Error(w, "deny_status must be 401, 403 or 429", http.StatusBadRequest)
			return
		}
	}
	req := &authRequest{r: r, client: h.clientAddr(r)}
	resp, err := h.Service.CheckHTTP(r.Context(), r.PathValue("domain"), req)
	switch {
	case errors.Is(err, service.ErrUnknownDomain):
		http.Error(w, "unknown domain "+strconv.Quote(r.PathValue("domain")), http.StatusNotFound)
		return
	case err != nil:
		var inv *service.InvalidError
		if errors.As(err, &inv) {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	hdr := w.Header()
	for _, h := range resp.Headers {
		hdr.Set(h.Key, h.Value)
	}
	hdr.Set("Content-Type", "text/plain; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	if resp.Code == service.OverLimit {
		w.WriteHeader(denyStatus)
		w.Write([]byte("rate limited\n"))
		return
	}
	w.Write([]byte("ok\n"))
}

// clientAddr returns the original client's address per AuthOptions.
func (h *handler) clientAddr(r *http.Request) netip.Addr {
	peer, _ := clientip.Parse(r.RemoteAddr)
	if len(h.Auth.TrustedProxies) == 0 {
		// The endpoint serves the proxy in front: believe what it says.
		if a, ok := clientip.Parse(r.Header.Get("X-Real-IP")); ok {
			return a
		}
		if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
			first, _, _ := strings.Cut(xff, ",")
			if a, ok := clientip.Parse(first); ok {
				return a
			}
		}
		return peer
	}
	trusted := clientip.Trusted(h.Auth.TrustedProxies)
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		return trusted.FromForwarded(peer, xff)
	}
	if a, ok := clientip.Parse(r.Header.Get("X-Real-IP")); ok && trusted.Contains(peer) {
		return a
	}
	return peer
}

// authRequest is the original request as nginx describes it.
type authRequest struct {
	r      *http.Request
	client netip.Addr
}

func (a *authRequest) Header(name string) (string, bool) {
	h := a.r.Header
	switch name {
	case ":method":
		return firstOf(h.Get("X-Original-Method"), h.Get("X-Forwarded-Method"), a.r.Method), true
	case ":path":
		return firstOf(h.Get("X-Original-URI"), h.Get("X-Forwarded-Uri"), a.r.URL.RequestURI()), true
	case ":authority":
		return firstOf(h.Get("X-Forwarded-Host"), a.r.Host), true
	}
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

func (a *authRequest) ClientAddr() netip.Addr { return a.client }

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
