package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/reloadlog"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestStatus: GET /debug/status tells, per limit, the decisions that rls's
// metrics counted (3 calls on a limit of 2 a minute: 2 ok, 1 over_limit;
// the key full), the loads of the reload log with their changes, the
// store's kind and a ping; loopback clients only, as /debug/*.
func TestStatus(t *testing.T) {
	reg := prometheus.NewRegistry()
	loads := reloadlog.New(0, func() time.Time { return time.Unix(1, 0) })
	svc := servetest.Service(t, explainConfig, service.Options{Observers: []service.Observer{
		decisionmetrics.New(reg, decisionmetrics.Options{}), loads}})
	svc.Reload(func() (*config.Config, error) { return svc.Config(), nil })
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: []config.Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	for range 3 {
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	h := New(Options{Service: svc, Gatherer: reg, Reloads: loads.Loads, StoreName: "memory"})
	get := func(remote string) (int, string) {
		r := httptest.NewRequest("GET", "/debug/status", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	code, body := get("127.0.0.1:5000")
	if code != 200 {
		t.Fatalf("GET /debug/status = %d %s", code, body)
	}
	var st StatusResult
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
	want := LimitStatus{Domain: "api", Limit: "remote_address/1m", OK: 2, OverLimit: 1, KeysHalf: 1, Keys80: 1, KeysFull: 1}
	if len(st.Limits) != 1 || st.Limits[0] != want {
		t.Errorf("limits = %+v, want [%+v]", st.Limits, want)
	}
	if st.Store.Kind != "memory" || !st.Store.Ready {
		t.Errorf("store = %+v, want memory, ready", st.Store)
	}
	if len(st.Reloads) != 1 || len(st.Reloads[0].Changes) != 3 || st.Reloads[0].Changes[0].Change != "added" {
		t.Errorf("reloads = %+v, want one load adding the 3 limits", st.Reloads)
	}
	if code, body := get("192.0.2.7:5000"); code != 403 {
		t.Errorf("GET /debug/status off loopback = %d %s, want 403", code, body)
	}
}
