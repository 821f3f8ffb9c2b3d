package daemon

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestStatusOnRedis: the running server's GET /debug/status names the
// store, its Redis node answering, and the initial config load with the
// limits it added.
func TestStatusOnRedis(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, tracedLimits)
	cfg := testConfig(path)
	srv := redistest.Start(t)
	cfg.Store.Kind, cfg.Store.Redis.URL = Redis, srv.URL()
	cfg.Store.Redis.Timeout = time.Second // a starved test machine
	r := start(t, cfg)
	resp, err := http.Get("http://" + r.httpAddr + "/debug/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var st httpapi.StatusResult
	if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /debug/status = %d %s (%v)", resp.StatusCode, body, err)
	}
	if st.Store.Kind != "redis" || !st.Store.Ready || len(st.Store.Nodes) != 1 || st.Store.Nodes[0].Addr != srv.Addr() || st.Store.Nodes[0].Error != "" {
		t.Errorf("store = %+v, want redis, ready, its node %s answering", st.Store, srv.Addr())
	}
	if len(st.Reloads) != 1 || st.Reloads[0].Error != "" || len(st.Reloads[0].Changes) == 0 {
		t.Errorf("reloads = %+v, want the initial load adding its limits", st.Reloads)
	}
}
