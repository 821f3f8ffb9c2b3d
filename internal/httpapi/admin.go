package httpapi

import (
	"context"
	"net"
	"net/http"

	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/service"
)

// Resetter answers POST /admin/reset; *service.Service implements it.
type Resetter interface {
	Reset(ctx context.Context, req *service.Request) (*service.ResetResult, error)
}

// admin guards an admin endpoint: loopback clients (unless RequireToken),
// and others with the bearer token of AdminToken; never a browser's
// request sent by another site's page (CSRF), nor one admitted as a
// loopback client that names another host (DNS rebinding). It passes next
// who is asking, for the log.
func (h *handler) admin(next func(w http.ResponseWriter, r *http.Request, who string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := crossSite(r); why != "" {
			h.refuse(r, why)
			http.Error(w, "refused: "+why, http.StatusForbidden)
			return
		}
		if !h.RequireToken && isLoopback(r.RemoteAddr) && rebound(r) == "" {
			next(w, r, "loopback "+r.RemoteAddr)
			return
		}
		if !h.tokenGiven(w, r) {
			return
		}
		next(w, r, "token "+r.RemoteAddr)
	})
}

// tokenGiven reports whether r carries the bearer token of AdminToken;
// when it does not, it answers r (403 without a token file, else 401) and
// logs the refusal at a bounded rate.
func (h *handler) tokenGiven(w http.ResponseWriter, r *http.Request) bool {
	if h.AdminToken == nil {
		why := "not loopback, no --admin-token-file"
		if h.RequireToken {
			why = "a token is required, no --admin-token-file"
		}
		h.refuse(r, why)
		http.Error(w, "this endpoint wants the bearer token of --admin-token-file, and rls has none", http.StatusForbidden)
		return false
	}
	if got, ok := bearer(r.Header.Get("Authorization")); !ok || !h.AdminToken.valid(got) {
		h.refuse(r, "no or wrong bearer token")
		w.Header().Set("WWW-Authenticate", `Bearer realm="rls admin"`)
		http.Error(w, "this endpoint wants the bearer token of --admin-token-file", http.StatusUnauthorized)
		return false
	}
	return true
}

// isLoopback reports whether a request's remote address is on a loopback
// address.
func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

// refuse logs a refused admin or debug request, at most once a second.
func (h *handler) refuse(r *http.Request, why string) {
	h.refused.Do(func() {
		h.Logger.Warn("request refused", "path", r.URL.Path, "from", r.RemoteAddr, "why", why)
	})
}

// reset answers POST /admin/reset: the body is a RateLimitRequest in
// proto3 JSON; every counter of the limits its descriptors match is
// cleared. The answer is the service's ResetResult in JSON (ResetResult),
// 200 (400 for a bad body).
func (h *handler) reset(w http.ResponseWriter, r *http.Request, who string) {
	body, ok := readBody(w, r, maxExplainBody)
	if !ok {
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
		h.Logger.Error("admin reset failed", "by", who, "domain", req.Domain, "error", err)
		http.Error(w, err.Error(), status)
		return
	}
	js := resetJSON(res)
	var limits []string
	for _, d := range js.Descriptors {
		limits = append(limits, d.Limits...)
	}
	h.Logger.Info("admin reset", "by", who, "domain", js.Domain, "descriptors", js.Descriptors, "limits", limits, "cleared", js.Cleared)
	writeJSON(w, js)
}
