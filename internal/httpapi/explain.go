package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/rlsproject/rls/internal/clientip"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/service"
)

// Explainer answers POST /debug/explain; *service.Service implements it.
type Explainer interface {
	Explain(ctx context.Context, req *service.Request) (*service.Explanation, error)
	ExplainHTTP(ctx context.Context, domain string, r httpdesc.Request) (*service.Explanation, error)
}

// maxExplainBody bounds the body of POST /debug/explain, as /json's.
const maxExplainBody = 1 << 20

// explainHTTPBody is the HTTP form of POST /debug/explain's body: a domain
// and the request whose descriptors its http_descriptors make.
type explainHTTPBody struct {
	Domain string      `json:"domain"`
	HTTP   explainHTTP `json:"http"`
}

type explainHTTP struct {
	Method    string            `json:"method"`
	Path      string            `json:"path"`
	Authority string            `json:"authority"`
	Headers   map[string]string `json:"headers"`
	// ClientAddress is the client's IP address (a port is ignored).
	ClientAddress string `json:"client_address"`
}

// explain answers POST /debug/explain: the body is a RateLimitRequest in
// proto3 JSON, or {"domain": ..., "http": {...}} for the descriptors that
// the domain's http_descriptors make of an HTTP request; the answer is the
// service's Explanation in JSON (Explanation), 200 (400 for a bad body).
func (h *handler) explain(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExplainBody))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var probe struct {
		HTTP json.RawMessage `json:"http"`
	}
	// A body that is not a JSON object is protojson's to refuse.
	_ = json.Unmarshal(body, &probe)
	var ex *service.Explanation
	if probe.HTTP != nil {
		hr, domain, ferr := httpForm(body)
		if ferr != nil {
			http.Error(w, ferr.Error(), http.StatusBadRequest)
			return
		}
		ex, err = h.Explain.ExplainHTTP(r.Context(), domain, hr)
	} else {
		req, derr := envoyrls.DecodeJSON(body)
		if derr != nil {
			http.Error(w, derr.Error(), http.StatusBadRequest)
			return
		}
		ex, err = h.Explain.Explain(r.Context(), req)
	}
	if err != nil {
		http.Error(w, err.Error(), envoyrls.HTTPStatus(err))
		return
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(explanationJSON(ex)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(out.Bytes())
}

// httpForm decodes the HTTP form of the body: the domain and the request.
func httpForm(body []byte) (*httpdesc.StaticRequest, string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var b explainHTTPBody
	if err := dec.Decode(&b); err != nil {
		return nil, "", fmt.Errorf("bad explain request: %w", err)
	}
	if b.Domain == "" {
		return nil, "", errors.New(`bad explain request: "domain" must be set`)
	}
	req := &httpdesc.StaticRequest{Method: b.HTTP.Method, Path: b.HTTP.Path, Authority: b.HTTP.Authority, Headers: b.HTTP.Headers}
	if b.HTTP.ClientAddress != "" {
		a, ok := clientip.Parse(b.HTTP.ClientAddress)
		if !ok {
			return nil, "", fmt.Errorf("bad explain request: client_address %q is not an IP address", b.HTTP.ClientAddress)
		}
		req.Client = a
	}
	return req, b.Domain, nil
}
