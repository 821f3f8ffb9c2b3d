package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/overrides"
)

// Overrider answers /admin/overrides and says what /readyz and
// /debug/config add of the overrides; *overrides.Keeper implements it.
type Overrider interface {
	Set(ctx context.Context, c overrides.Change, who string) (overrides.Listed, error)
	Delete(ctx context.Context, k overrides.Key, who string) (overrides.JSON, error)
	List(domain string) []overrides.Listed
	Status() overrides.Status
}

// maxOverrideBody bounds the body of PUT and DELETE /admin/overrides.
const maxOverrideBody = 64 << 10

// overridesList is the answer of GET /admin/overrides.
type overridesList struct {
	Overrides []overrides.Listed `json:"overrides"`
}

// putOverride answers PUT /admin/overrides: the body is an override
// (overrides.ParseChange); the answer is the override kept, as listed, 200;
// 400 for a bad body or an override the loaded config refuses, 503 when
// the store fails.
func (h *handler) putOverride(w http.ResponseWriter, r *http.Request, who string) {
	body, ok := readBody(w, r, maxOverrideBody)
	if !ok {
		return
	}
	c, err := overrides.ParseChange(body)
	if err != nil {
		http.Error(w, "bad override: "+err.Error(), http.StatusBadRequest)
		return
	}
	kept, err := h.Overrides.Set(r.Context(), c, who)
	if err != nil {
		h.overrideFailed(w, "set", who, c.Key, err)
		return
	}
	writeJSON(w, kept)
}

// deleteOverride answers DELETE /admin/overrides: the body names the
// override (domain, descriptor, name); the answer is the override
// removed, 200, or 404 when there is none.
func (h *handler) deleteOverride(w http.ResponseWriter, r *http.Request, who string) {
	body, ok := readBody(w, r, maxOverrideBody)
	if !ok {
		return
	}
	k, err := overrides.ParseKey(body)
	if err != nil {
		http.Error(w, "bad override: "+err.Error(), http.StatusBadRequest)
		return
	}
	gone, err := h.Overrides.Delete(r.Context(), k, who)
	if err != nil {
		h.overrideFailed(w, "delete", who, k, err)
		return
	}
	writeJSON(w, gone)
}

// listOverrides answers GET /admin/overrides[?domain=D].
func (h *handler) listOverrides(w http.ResponseWriter, r *http.Request, _ string) {
	writeJSON(w, overridesList{Overrides: h.Overrides.List(r.URL.Query().Get("domain"))})
}

// overrideFailed answers a change of an override that failed with err.
func (h *handler) overrideFailed(w http.ResponseWriter, op, who string, k overrides.Key, err error) {
	var fe *overrides.FieldError
	var re *overrides.RefusedError
	status := http.StatusServiceUnavailable
	switch {
	case errors.As(err, &fe):
		status = http.StatusBadRequest
		err = fmt.Errorf("bad override: %w", err)
	case errors.As(err, &re):
		status = http.StatusBadRequest
	case errors.Is(err, overrides.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, overrides.ErrFull):
		status = http.StatusInsufficientStorage
	default:
		h.Logger.Error("admin override "+op+" failed", "by", who, "override", k.String(), "error", err)
	}
	http.Error(w, err.Error(), status)
}

// readBody reads r's body, at most limit bytes; on error it answers 400
// (an admin endpoint's body).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return body, true
}

// writeJSON answers v as indented JSON, 200.
func writeJSON(w http.ResponseWriter, v any) {
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(out, '\n'))
}

// overridesDump is the list of the overrides that GET /debug/config ends
// with; none without an Overrider.
func (h *handler) overridesDump() []config.DumpList {
	if h.Overrides == nil {
		return nil
	}
	list := h.Overrides.List("")
	return []config.DumpList{{Key: "overrides", N: len(list), Elem: func(i int) any { return list[i] }}}
}

// overridesReady is what /readyz adds of the overrides: a line when the
// copy held is stale (the store could not be read), "" otherwise. Stale
// overrides do not make rls unready: the store's own readiness says
// whether decisions can be made, and they are made with the last copy.
func (h *handler) overridesReady() string {
	if h.Overrides == nil {
		return ""
	}
	st := h.Overrides.Status()
	if st.Stale == nil {
		return ""
	}
	return fmt.Sprintf("overrides: stale for %s (the store cannot be read: %v); deciding with the last copy read: %d overrides, version %d\n",
		time.Since(st.Since).Round(time.Millisecond), st.Stale, st.Count, st.Version)
}
