package httpdesc

import (
	"fmt"
	"net/netip"
	"strings"
)

// Trace is what one item of http_descriptors made of a request: its
// descriptor, or the action that dropped it and why.
type Trace struct {
	// Index is the item's position in the list; Line and Column locate it
	// in its file.
	Index        int
	Line, Column int
	// Entries is the descriptor the item made; nil when it made none.
	Entries []Entry
	// When the item made no descriptor: Action is the index of the action
	// that could not produce its entry (-1 when every action was skipped),
	// ActionName its kind ("request_headers", ...), and Reason why.
	Action     int
	ActionName string
	Reason     string
}

// Explain applies l to r as Build does and says, item by item, what each
// made or why it made nothing. The descriptors made are those Build
// returns, in the same order.
func (l List) Explain(r Request) []Trace {
	if l == nil {
		return nil
	}
	out := make([]Trace, 0, len(l))
	for i, h := range l {
		tr := Trace{Index: i, Line: h.Line, Column: h.Column}
		entries, failed := h.apply(r)
		switch tr.Action = failed; {
		case failed >= 0:
			a := h.actions[failed]
			tr.ActionName, tr.Reason = a.Kind.String(), a.whyNot(r)
		case len(entries) == 0:
			tr.Reason = "every action was skipped (skip_if_absent): no entries"
		default:
			tr.Entries = entries
		}
		out = append(out, tr)
	}
	return out
}

// whyNot says why a could not produce its entry for r.
func (a *action) whyNot(r Request) string {
	switch a.Kind {
	case actionRemoteAddress, actionMaskedRemoteAddress:
		if !r.ClientAddr().IsValid() {
			return "no client address"
		}
		return fmt.Sprintf("client address %s cannot be masked", r.ClientAddr())
	case actionRequestHeaders:
		return fmt.Sprintf("no header %q", a.HeaderName)
	case actionQueryParameters:
		return fmt.Sprintf("no query parameter %q", a.QueryParameterName)
	case actionHeaderValueMatch:
		if a.ExpectMatch {
			return "the headers did not match"
		}
		return "the headers matched (expect_match: false)"
	}
	return "no entry"
}

// StaticRequest is a Request given by its parts, for tools that describe
// a request rather than receive one (rls test, POST /debug/explain). The
// zero value is a request with no headers and no client address. Safe for
// concurrent use once made.
type StaticRequest struct {
	Method    string // ":method"; absent when empty
	Path      string // ":path", with the query string; absent when empty
	Authority string // ":authority"; absent when empty
	// Headers maps header names (in any case) to their value.
	Headers map[string]string
	Client  netip.Addr
}

// Header implements Request.
func (r *StaticRequest) Header(name string) (string, bool) {
	switch name {
	case ":method":
		return r.Method, r.Method != ""
	case ":path":
		return r.Path, r.Path != ""
	case ":authority":
		return r.Authority, r.Authority != ""
	}
	if v, ok := r.Headers[name]; ok {
		return v, true
	}
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// ClientAddr implements Request.
func (r *StaticRequest) ClientAddr() netip.Addr { return r.Client }
