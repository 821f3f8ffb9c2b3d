package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/topkeys"
)

// TopKeys answers GET /debug/top; *topkeys.Keys implements it.
type TopKeys interface {
	Top(ctx context.Context, q topkeys.Query) (*topkeys.Result, error)
}

// maxTopN bounds the keys per limit a query may ask for.
const maxTopN = 1000

// The JSON of GET /debug/top (a field's name and form are part of the
// API; rls top and the operator page read it).

// TopResult is the answer of GET /debug/top.
type TopResult struct {
	Limits []TopLimit `json:"limits"`
	// Processes is how many rls processes' summaries are merged (this
	// one's and those the others sharing the store published).
	Processes int `json:"processes"`
	// Note says what is missing, when something is.
	Note string `json:"note,omitempty"`
	// By is the ranking: denied or fullness.
	By string `json:"by"`
}

// TopLimit is one limit's top keys over its current window.
type TopLimit struct {
	Domain string `json:"domain"`
	// Descriptor is the limit's config node: key and value per level
	// (value "" for any value).
	Descriptor []EntryJSON `json:"descriptor"`
	Name       string      `json:"name"`
	// RequestsPerUnit is the limit's, in this process's config (absent
	// for a limit only another process has).
	RequestsPerUnit *uint32   `json:"requests_per_unit,omitempty"`
	WindowStart     time.Time `json:"window_start"`
	WindowEnd       time.Time `json:"window_end"`
	// Denials and Decisions are the window's, over the processes.
	Denials   uint64 `json:"denials"`
	Decisions uint64 `json:"decisions"`
	// Error: a key's true denials are in [denied − error, denied]; at
	// most denials / K.
	Error uint64   `json:"error"`
	Keys  []TopKey `json:"keys"`
}

// TopKey is one key of a limit, with what an operator does next.
type TopKey struct {
	Descriptor []EntryJSON `json:"descriptor"`
	// Denied is at most Error above the key's true denials (its own
	// error); Admitted counts since the key entered the sketch.
	Denied   uint64  `json:"denied"`
	Admitted uint64  `json:"admitted"`
	Fullness float64 `json:"fullness"`
	Error    uint64  `json:"error"`
	// Shortened: a key or value was cut (at 128 bytes, then "…" and a
	// hash); no request or command is given for it.
	Shortened bool `json:"shortened,omitempty"`
	// Request is the RateLimitRequest of this key, in proto3 JSON: the body
	// of POST /debug/explain and POST /admin/reset.
	Request *TopRequest `json:"request,omitempty"`
	// Commands are the command lines of rls explain, rls reset and rls
	// override set for it (override: a limit of 0 for an hour, to edit);
	// absent when a value cannot be written on one (a comma).
	Commands *TopCommands `json:"commands,omitempty"`
}

// TopRequest is a RateLimitRequest of one descriptor.
type TopRequest struct {
	Domain      string           `json:"domain"`
	Descriptors []TopRequestDesc `json:"descriptors"`
}

// TopRequestDesc is a descriptor of TopRequest.
type TopRequestDesc struct {
	Entries []EntryJSON `json:"entries"`
}

// TopCommands are command lines for a key.
type TopCommands struct {
	Explain  string `json:"explain"`
	Reset    string `json:"reset"`
	Override string `json:"override"`
}

// top answers GET /debug/top?domain=D&name=LIMIT&by=denied|fullness&n=N
// (each optional): the top keys of the limits asked, merged over the
// processes sharing the store. 400 for a bad query.
func (h *handler) top(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := topkeys.Query{Domain: q.Get("domain"), Name: q.Get("name"), N: topkeys.DefaultN}
	var err error
	if query.By, err = topkeys.ParseOrder(q.Get("by")); err != nil {
		http.Error(w, "by: "+err.Error(), http.StatusBadRequest)
		return
	}
	if s := q.Get("n"); s != "" {
		if query.N, err = strconv.Atoi(s); err != nil || query.N < 1 || query.N > maxTopN {
			http.Error(w, fmt.Sprintf("n: %q is not a number from 1 to %d", s, maxTopN), http.StatusBadRequest)
			return
		}
	}
	res, err := h.Top.Top(r.Context(), query)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, topJSON(res, query.By))
}

// topJSON is res as GET /debug/top writes it.
func topJSON(res *topkeys.Result, by topkeys.Order) TopResult {
	out := TopResult{Limits: []TopLimit{}, Processes: res.Processes, Note: res.Note, By: by.String()}
	for _, l := range res.Limits {
		tl := TopLimit{Domain: l.Domain, Descriptor: entriesJSON(l.Path), Name: l.Name, WindowStart: l.WindowStart, WindowEnd: l.WindowEnd,
			Denials: l.Denials, Decisions: l.Decisions, Error: l.Error, Keys: []TopKey{}}
		if l.Limit != nil && l.Limit.Rule != nil {
			rpu := l.Limit.Rule.Limit
			tl.RequestsPerUnit = &rpu
		}
		for _, k := range l.Keys {
			tk := TopKey{Descriptor: entriesJSON(k.Entries), Denied: k.Denied, Admitted: k.Admitted, Fullness: k.Fullness, Error: k.Error, Shortened: k.Shortened}
			if !k.Shortened {
				tk.Request = &TopRequest{Domain: l.Domain, Descriptors: []TopRequestDesc{{Entries: tk.Descriptor}}}
				tk.Commands = commandsFor(l, k.Entries)
			}
			tl.Keys = append(tl.Keys, tk)
		}
		out.Limits = append(out.Limits, tl)
	}
	return out
}

// commandsFor returns the command lines of rls explain, rls reset and rls
// override set for a key of limit l, nil when one of its entries cannot
// be written on them (a comma in a value, '=' or ',' in a key: rls reads
// key=value,key=value).
func commandsFor(l topkeys.LimitTop, entries []config.Entry) *TopCommands {
	var kv []string
	for _, e := range entries {
		if strings.Contains(e.Value, ",") || strings.ContainsAny(e.Key, "=,") || e.Key == "" {
			return nil
		}
		kv = append(kv, e.Key+"="+e.Value)
	}
	desc := ShellQuote(strings.Join(kv, ","))
	domain := ShellQuote(l.Domain)
	override := "rls override set " + domain
	for _, a := range kv {
		override += " " + ShellQuote(a)
	}
	if l.Limit != nil && l.Limit.Name != "" {
		override += " --name " + ShellQuote(l.Limit.Name)
	}
	override += " --requests-per-unit 0 --ttl 1h --reason " + ShellQuote("rls top: "+l.Name)
	return &TopCommands{
		Explain:  "rls explain " + domain + " " + desc,
		Reset:    "rls reset " + domain + " " + desc,
		Override: override,
	}
}

// ShellQuote returns s as one word of a POSIX shell: as it is when it
// holds only safe characters, else in single quotes.
func ShellQuote(s string) string {
	safe := s != ""
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.,:/=@%+", c)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
