package ui

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/overrides"
)

//go:embed assets
var assets embed.FS

// MaxRows bounds the limit rows the page shows; past it the view says how
// many more /debug/config holds.
const MaxRows = 2000

// maxRead bounds what the page reads of one endpoint's answer.
const maxRead = 8 << 20

// views are the page's sections, in order: each is served alone at
// /ui/part/{name} for the script's refresh.
var views = []string{"limits", "top", "explain", "overrides", "reloads", "system"}

// The headers of every answer: the page's own script and style only, no
// framing (clickjacking), no referrer, nothing cached.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Referrer-Policy":        "no-referrer",
	"Cache-Control":          "no-store",
}

// Handler serves the page. Safe for concurrent use.
type Handler struct {
	api    http.Handler
	tmpl   *template.Template
	static http.Handler
}

// New returns the page's handler, mounted at /ui/, that reads the
// endpoints of api.
func New(api http.Handler) *Handler {
	tmpl := template.Must(template.New("page.html").Funcs(template.FuncMap{
		"entries":  entriesText,
		"fullness": func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) },
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"ms": func(s float64) string { return fmt.Sprintf("%.2f ms", s*1000) },
		"mean": func(sum float64, n uint64) string {
			if n == 0 {
				return "–"
			}
			return fmt.Sprintf("%.3f ms", sum/float64(n)*1000)
		},
	}).ParseFS(assets, "assets/page.html"))
	sub, _ := fs.Sub(assets, "assets") // a fixed directory of the embed
	return &Handler{api: api, tmpl: tmpl, static: http.StripPrefix("/ui/", http.FileServerFS(sub))}
}

// ServeHTTP serves GET /ui/ (the page), /ui/part/{view} (one view) and
// the page's script and style.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch p := r.URL.Path; {
	case p == "/ui/":
		h.render(w, "page", h.read(r, views))
	case strings.HasPrefix(p, "/ui/part/"):
		name := strings.TrimPrefix(p, "/ui/part/")
		if !slices.Contains(views, name) {
			http.NotFound(w, r)
			return
		}
		h.render(w, name, h.read(r, []string{name}))
	case p == "/ui/app.js" || p == "/ui/style.css":
		h.static.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

// render writes the template name of data, whole or not at all.
func (h *Handler) render(w http.ResponseWriter, name string, data *pageData) {
	var b bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(b.Bytes())
}

// pageData is what the views show: each endpoint's answer, or why it
// could not be read (Errs, by view).
type pageData struct {
	Now       time.Time
	Domains   []domainView
	More      int // limit rows left out past MaxRows
	Top       *httpapi.TopResult
	Overrides []overrides.Listed
	Status    *httpapi.StatusResult
	Errs      map[string]string
}

// domainView is one domain's limits, a row per limit (or per node without
// one), in the tree's order.
type domainView struct {
	Name, File string
	Rows       []limitRow
}

// limitRow is one limit of the tree, and what is live about it.
type limitRow struct {
	Domain, Path string
	Depth        int
	NodeFlags    []string
	// Label is empty for a node without limits.
	Label, Name, Window, Algorithm, Limit string
	Flags                                 []string
	Overrides                             []string
	Live                                  *httpapi.LimitStatus
}

// read asks the endpoints that the views in want show.
func (h *Handler) read(r *http.Request, want []string) *pageData {
	d := &pageData{Now: time.Now().UTC(), Errs: map[string]string{}}
	need := func(vs ...string) bool {
		for _, v := range vs {
			if slices.Contains(want, v) {
				return true
			}
		}
		return false
	}
	if need("limits", "reloads", "system") {
		var st httpapi.StatusResult
		if err := h.getJSON(r, "/debug/status", &st); err != nil {
			for _, v := range []string{"limits", "reloads", "system"} {
				d.Errs[v] = err.Error()
			}
		} else {
			d.Status = &st
		}
	}
	if need("limits", "overrides", "explain") {
		var cfg configDump
		if err := h.getJSON(r, "/debug/config", &cfg); err != nil {
			for _, v := range []string{"limits", "overrides", "explain"} {
				d.Errs[v] = err.Error()
			}
		} else {
			d.Overrides = cfg.Overrides
			d.Domains, d.More = cfg.views(d.Status, MaxRows)
		}
	}
	if need("top") {
		var top httpapi.TopResult
		if err := h.getJSON(r, "/debug/top?by=denied&n=10", &top); err != nil {
			d.Errs["top"] = err.Error()
		} else {
			d.Top = &top
		}
	}
	return d
}

// getJSON asks the API for path as r's client (its address, host and
// credentials: the API's access rules apply as to r itself) and decodes
// the answer into v.
func (h *Handler) getJSON(r *http.Request, path string, v any) error {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	req.RemoteAddr, req.Host = r.RemoteAddr, r.Host
	for _, k := range []string{"Authorization", "Origin", "Sec-Fetch-Site"} {
		if v := r.Header.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	rec := &recorder{header: http.Header{}, code: http.StatusOK}
	h.api.ServeHTTP(rec, req)
	if rec.code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", strings.SplitN(path, "?", 2)[0], rec.code, strings.TrimSpace(rec.body.String()))
	}
	if rec.full {
		return fmt.Errorf("GET %s: the answer is longer than the page reads (%d bytes)", path, maxRead)
	}
	if err := json.Unmarshal(rec.body.Bytes(), v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// recorder is the ResponseWriter of an in-process request: it keeps the
// status and the first maxRead bytes of the body.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
	full   bool
}

func (r *recorder) Header() http.Header  { return r.header }
func (r *recorder) WriteHeader(code int) { r.code = code }
func (r *recorder) Write(p []byte) (int, error) {
	if r.body.Len()+len(p) > maxRead {
		r.full = true
		return len(p), nil
	}
	return r.body.Write(p)
}

// configDump is the part of GET /debug/config the page shows. Nodes and
// limits are kept as their JSON fields, so that a flag the page does not
// know (a new one) is still shown.
type configDump struct {
	Domains []struct {
		Name        string                       `json:"name"`
		File        string                       `json:"file"`
		Descriptors []map[string]json.RawMessage `json:"descriptors"`
	} `json:"domains"`
	Overrides []overrides.Listed `json:"overrides"`
}

// The fields of a node or limit that the views show in their own columns;
// the others are flags.
var (
	nodeFields  = []string{"path", "key", "value", "line", "column", "limits", "descriptors", "metadata"}
	limitFields = []string{"index", "id", "label", "name", "algorithm", "unit", "unit_multiplier", "window", "window_seconds",
		"requests_per_unit", "line", "column", "lease_ttl"}
)

// views returns the domains as rows, at most max in all, and how many
// more there are.
func (c *configDump) views(st *httpapi.StatusResult, max int) ([]domainView, int) {
	live := map[[2]string]*httpapi.LimitStatus{}
	if st != nil {
		for i := range st.Limits {
			l := &st.Limits[i]
			live[[2]string{l.Domain, l.Limit}] = l
		}
	}
	var out []domainView
	rows, more := 0, 0
	for _, d := range c.Domains {
		dv := domainView{Name: d.Name, File: d.File}
		var walk func(nodes []map[string]json.RawMessage, depth int)
		walk = func(nodes []map[string]json.RawMessage, depth int) {
			for _, n := range nodes {
				var limits []map[string]json.RawMessage
				var children []map[string]json.RawMessage
				json.Unmarshal(n["limits"], &limits)
				json.Unmarshal(n["descriptors"], &children)
				base := limitRow{Domain: d.Name, Path: str(n["path"]), Depth: depth, NodeFlags: flags(n, nodeFields)}
				if len(limits) == 0 {
					limits = []map[string]json.RawMessage{nil}
				}
				for _, l := range limits {
					if rows >= max {
						more++
						continue
					}
					rows++
					row := base
					if l != nil {
						row.Label, row.Name, row.Algorithm = str(l["label"]), str(l["name"]), str(l["algorithm"])
						row.Window = str(l["window"])
						if ttl := str(l["lease_ttl"]); ttl != "" {
							row.Window = "in flight, lease_ttl " + ttl
						}
						row.Limit = str(l["requests_per_unit"])
						row.Flags = flags(l, limitFields)
						row.Live = live[[2]string{d.Name, row.Label}]
						for _, o := range c.Overrides {
							if o.Domain == d.Name && slices.Contains(o.Limits, row.Label) {
								row.Overrides = append(row.Overrides, overrideText(o))
							}
						}
					}
					dv.Rows = append(dv.Rows, row)
				}
				walk(children, depth+1)
			}
		}
		walk(d.Descriptors, 0)
		out = append(out, dv)
	}
	return out, more
}

// flags are the fields of m not in known, as "name" (true) or
// "name: value" (an object's fields as "field value, ..."), sorted.
func flags(m map[string]json.RawMessage, known []string) []string {
	var out []string
	for k, v := range m {
		if slices.Contains(known, k) {
			continue
		}
		var val any
		json.Unmarshal(v, &val)
		switch val := val.(type) {
		case bool:
			if val {
				out = append(out, k)
			}
		case nil:
		case []any:
			var parts []string
			for _, e := range val {
				parts = append(parts, fmt.Sprint(e))
			}
			out = append(out, k+": "+strings.Join(parts, ", "))
		case map[string]any:
			var parts []string
			for _, f := range slices.Sorted(maps.Keys(val)) {
				parts = append(parts, fmt.Sprintf("%s %v", f, val[f]))
			}
			out = append(out, k+": "+strings.Join(parts, ", "))
		default:
			if s := fmt.Sprint(val); s != "" {
				out = append(out, k+": "+s)
			}
		}
	}
	slices.Sort(out)
	return out
}

// str is a JSON scalar as text ("" when absent).
func str(raw json.RawMessage) string {
	if raw == nil {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// overrideText is an override as a limit row shows it.
func overrideText(o overrides.Listed) string {
	s := entriesText(o.Descriptor) + " → " + fmt.Sprint(o.RequestsPerUnit)
	if o.ExpiresAt != nil {
		s += " until " + o.ExpiresAt.UTC().Format(time.RFC3339)
	}
	if o.Reason != "" {
		s += " (" + o.Reason + ")"
	}
	return s
}

// entriesText is a descriptor (a request's, or an override's) as
// key=value,key=value, as rls's commands take it.
func entriesText(v any) string {
	switch es := v.(type) {
	case []httpapi.EntryJSON:
		return httpapi.DescriptorText(es)
	case []overrides.EntryJSON:
		conv := make([]httpapi.EntryJSON, len(es))
		for i, e := range es {
			conv[i] = httpapi.EntryJSON{Key: e.Key, Value: e.Value}
		}
		return httpapi.DescriptorText(conv)
	}
	return ""
}
