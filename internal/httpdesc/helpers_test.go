package httpdesc

import (
	"net/netip"
	"testing"

	"github.com/rlsproject/rls/internal/strictyaml"
)

// Helpers shared by the package's tests.

// read parses list, the YAML of an http_descriptors list, as a config
// file's reader does, and returns what Parse made and the problems.
func read(list string) (List, []*strictyaml.Error) {
	data := []byte("http_descriptors: " + list + "\n")
	r := strictyaml.NewReader("h.yaml", strictyaml.Options{NullIsZero: true})
	var l List
	for root := range r.Documents(data) {
		for _, f := range r.Fields(root) {
			l = Parse(r, f)
		}
	}
	return l, strictyaml.SortErrors(r.Errors())
}

// parse is read for a valid list, failing the test on a problem.
func parse(t *testing.T, list string) List {
	t.Helper()
	l, errs := read(list)
	if len(errs) > 0 {
		t.Fatalf("Parse(http_descriptors: %s): %v", list, strictyaml.ErrorList(errs))
	}
	return l
}

// fakeRequest is a Request with fixed headers (lower-case names) and
// client address.
type fakeRequest struct {
	headers map[string]string
	addr    netip.Addr
}

func (r fakeRequest) Header(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r fakeRequest) ClientAddr() netip.Addr { return r.addr }

func req(addr string, kv ...string) fakeRequest {
	r := fakeRequest{headers: map[string]string{}}
	if addr != "" {
		r.addr = netip.MustParseAddr(addr)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		r.headers[kv[i]] = kv[i+1]
	}
	return r
}

func entries(kv ...string) []Entry {
	out := []Entry{}
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}
