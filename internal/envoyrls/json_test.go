package envoyrls

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// postJSON sends body to POST /json of h and returns the status and body.
func postJSON(h http.Handler, body io.Reader) (int, string) {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/json", body))
	return w.Code, w.Body.String()
}

func TestJSON(t *testing.T) {
	h := newServer(t).JSON()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}],"hitsAddend":"2"}]}`
	for i, step := range []struct {
		code int
		want string
	}{
		{200, `"overallCode":"OK"`},
		{429, `"overallCode":"OVER_LIMIT"`}, // 2 per second, 2 taken
	} {
		code, out := postJSON(h, strings.NewReader(body))
		if code != step.code || !strings.Contains(out, step.want) {
			t.Errorf("step %d: POST /json = %d %q, want %d with %s", i, code, out, step.code, step.want)
		}
	}
	for _, bad := range []string{
		`{`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":5}}]}`, // override without a unit
		`{"domain":"api","nope":1}`,
		`{"domain":"api","descriptors":[]}`,
	} {
		if code, out := postJSON(h, strings.NewReader(bad)); code != 400 {
			t.Errorf("POST /json %s = %d %q, want 400", bad, code, out)
		}
	}
}

// endless is a body that never ends, and counts what was read of it.
type endless struct{ read int }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	e.read += len(p)
	return len(p), nil
}

// TestJSONBodyBoundWhileReading: a body over maxJSONBody is refused once
// the bound is passed, not read whole (it has no end here).
func TestJSONBodyBoundWhileReading(t *testing.T) {
	body := &endless{}
	code, out := postJSON(newServer(t).JSON(), body)
	if code != 400 || !strings.Contains(out, "too large") {
		t.Errorf("POST /json with an endless body = %d %q, want 400 naming the bound", code, out)
	}
	if body.read > maxJSONBody+64<<10 {
		t.Errorf("read %d bytes of the body, want about the %d-byte bound", body.read, maxJSONBody)
	}
}

type downStore struct{}

func (downStore) Apply(context.Context, []engine.Item, []engine.Result) (bool, error) {
	return false, errors.New("dial tcp 127.0.0.1:6379: connection refused")
}

func TestJSONStoreDown(t *testing.T) {
	h := New(servetest.Service(t, config, service.Options{Store: downStore{}})).JSON()
	code, out := postJSON(h, strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"1"}]}]}`))
	if code != 503 || !strings.Contains(out, "connection refused") {
		t.Errorf("POST /json with the store down = %d %q, want 503 naming the cause", code, out)
	}
}

func FuzzJSON(f *testing.F) {
	h := newServer(f).JSON()
	f.Add(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]}]}`)
	f.Add(`{"domain":"api","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":1,"unit":"SECOND"},"hitsAddend":"18446744073709551615","isNegativeHits":true}],"hitsAddend":4294967295}`)
	f.Add(`{"domain":"api","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":5}}]}`)
	f.Add(`{"domain":"\u0000","descriptors":[{"entries":[{"key":"a_b","value":"c"}]},{"entries":[{"key":"a","value":"b_c"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		switch code, out := postJSON(h, strings.NewReader(body)); code {
		case 200, 400, 429:
		default:
			t.Fatalf("POST /json %q answered %d: %s", body, code, out)
		}
	})
}

// jsonDescriptors returns a /json body of domain api with n descriptors of
// one entry, the entry written as entry, and then tail before the closing
// brace.
func jsonDescriptors(n int, entry, tail string) string {
	var b strings.Builder
	b.WriteString(`{"domain":"api","descriptors":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"entries":[` + entry + `]}`)
	}
	b.WriteString("]" + tail + "}")
	return b.String()
}

// TestJSONShapeCheckedWhileScanning: /json refuses a body of more
// descriptors or entries than the service allows with the service's own
// message, after a scan that builds nothing: a 1 MiB body of 61,000
// descriptors, which protojson would build whole (200 ms, 27 MB), costs a
// few allocations; a malformed tail or escaped keys do not get around it.
func TestJSONShapeCheckedWhileScanning(t *testing.T) {
	s := newServer(t)
	h := s.JSON()
	entries := `{"domain":"api","descriptors":[{"entries":[` + strings.Repeat(`{"key":"k","value":"v"},`, 99) + `{"key":"k","value":"v"}]}]}`
	for _, tc := range []struct {
		name, body, want string
		sameAsService    bool
	}{
		{"100 descriptors", jsonDescriptors(100, `{"key":"k","value":"v"}`, ""), "descriptors: 100 descriptors, at most 64 allowed", true},
		{"100 entries", entries, "descriptors[0].entries: 100 entries, at most 16 allowed", true},
		{"escaped keys", strings.ReplaceAll(jsonDescriptors(100, `{}`, ""), `"descriptors"`, `"descr\u0069ptors"`), "descriptors: 100 descriptors, at most 64 allowed", true},
		{"a malformed tail", jsonDescriptors(100, `{}`, `,"x":[[[`), "descriptors: 100 descriptors, at most 64 allowed", false},
		{"65 null descriptors", jsonDescriptors(65, ``, ""), "descriptors: 65 descriptors, at most 64 allowed", true},
	} {
		code, out := postJSON(h, strings.NewReader(tc.body))
		if code != 400 || strings.TrimSpace(out) != tc.want {
			t.Errorf("%s: POST /json = %d %q, want 400 %q", tc.name, code, out, tc.want)
		}
		if !tc.sameAsService {
			continue
		}
		var in rlsv3.RateLimitRequest
		if err := protojson.Unmarshal([]byte(tc.body), &in); err != nil {
			t.Fatalf("%s: protojson: %v", tc.name, err)
		}
		if _, err := s.decide(context.Background(), &in); err == nil || err.Error() != tc.want {
			t.Errorf("%s: the service says %v, want %q", tc.name, err, tc.want)
		}
	}
	huge := []byte(jsonDescriptors(61_000, `{}`, ""))
	if len(huge) < 1_000_000 || len(huge) > maxJSONBody {
		t.Fatalf("the hostile body is %d bytes, want about 1 MiB", len(huge))
	}
	if code, out := postJSON(h, bytes.NewReader(huge)); code != 400 || !strings.Contains(out, "61000 descriptors, at most 64 allowed") {
		t.Errorf("POST /json of 61,000 descriptors = %d %q, want 400 naming the bound", code, out)
	}
	allocs := testing.AllocsPerRun(3, func() {
		if checkJSONShape(huge) == nil {
			t.Fatal("61,000 descriptors passed the scan")
		}
	})
	if allocs > 8 {
		t.Errorf("scanning 61,000 descriptors made %v allocations, want a handful", allocs)
	}
	// Within bounds, the scan lets protojson and the service decide.
	if code, out := postJSON(h, strings.NewReader(jsonDescriptors(2, `{"key":"remote_address","value":"10.1.1.1"}`, ""))); code != 200 {
		t.Errorf("POST /json of 2 descriptors = %d %q, want 200", code, out)
	}
	if code, _ := postJSON(h, strings.NewReader(`{"domain":"api","x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`}`)); code != 400 {
		t.Errorf("POST /json nested 100 deep = %d, want 400 (protojson's unknown field)", code)
	}
}

// FuzzJSONShape: whatever the scan refuses, protojson or the service
// refuses too.
func FuzzJSONShape(f *testing.F) {
	s := newServer(f)
	f.Add(jsonDescriptors(2, `{"key":"k","value":"v"}`, ""))
	f.Add(jsonDescriptors(65, `{}`, ""))
	f.Add(`{"domain":null,"descriptors":null}`)
	f.Add(`{"descriptors":[{"entries":[{},{}]}],"domain":"a\"b"}`)
	f.Fuzz(func(t *testing.T, body string) {
		err := checkJSONShape([]byte(body))
		if err == nil {
			return
		}
		var in rlsv3.RateLimitRequest
		if protojson.Unmarshal([]byte(body), &in) != nil {
			return
		}
		if _, serr := s.decide(context.Background(), &in); serr == nil {
			t.Fatalf("the scan refused %q (%v), protojson and the service accept it", body, err)
		}
	})
}
