package envoyrls

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
// the bound is passed, not read whole (it has no end here: blanks, which
// the check walks over).
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

func (s downStore) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return s.Apply(ctx, items, results)
}

func (downStore) Reset(context.Context, []engine.Item) (int, error) {
	return 0, errors.New("dial tcp 127.0.0.1:6379: connection refused")
}
func (downStore) Ping(context.Context) error {
	return errors.New("dial tcp 127.0.0.1:6379: connection refused")
}

func TestJSONStoreDown(t *testing.T) {
	h := New(servetest.Service(t, limitsYAML, service.Options{Store: downStore{}})).JSON()
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
