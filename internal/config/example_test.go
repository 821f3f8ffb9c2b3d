package config

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
)

// TestExampleConfig loads config/limits.yaml, the file `make run` serves,
// and checks what its comments promise.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../../config/limits.yaml")
	if err != nil {
		t.Fatalf("Load(config/limits.yaml): %v", err)
	}
	api := c.Domain("api")
	if api == nil || len(c.Domains()) != 1 {
		t.Fatalf("domains = %v, want just api", c.Domains())
	}
	type window struct {
		rpu    uint32
		window time.Duration
		alg    string
	}
	limitsOf := func(entries ...Entry) []window {
		t.Helper()
		n := api.Match(entries)
		if n == nil {
			t.Fatalf("Match(%v) = nil", entries)
		}
		var out []window
		for _, l := range n.Limits {
			out = append(out, window{l.Rule.Limit, l.Rule.Window, l.Rule.Algorithm()})
		}
		return out
	}

	got := limitsOf(Entry{Key: "remote_address", Value: "203.0.113.7"})
	want := []window{{10, time.Second, engine.FixedWindow}, {120, time.Minute, engine.FixedWindow}, {240, time.Hour, engine.SlidingWindow}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("remote_address limits = %+v, want %+v", got, want)
	}

	key := api.Match([]Entry{{Key: "api_key", Value: "k-123"}})
	if len(key.Limits) != 2 {
		t.Fatalf("api_key: %d limits, want 2", len(key.Limits))
	}
	if tb := key.Limits[0].Rule; tb.Algorithm() != engine.TokenBucket || tb.Limit != 50 || tb.Burst != 100 || tb.Window != time.Second {
		t.Errorf("api_key token bucket = %+v, want 50/s burst 100", tb)
	}
	if q := key.Limits[1]; q.Name != "daily_quota" || q.Rule.Limit != 100000 || q.Rule.Window != 24*time.Hour {
		t.Errorf("api_key quota = %+v, want daily_quota 100000/day", q)
	}
	if mon := api.Match([]Entry{{Key: "api_key", Value: "internal-monitoring"}}); len(mon.Limits) != 1 || !mon.Limits[0].Unlimited {
		t.Errorf("api_key=internal-monitoring = %+v, want one unlimited limit", mon)
	}

	tenant := api.Match([]Entry{{Key: "tenant", Value: "acme"}})
	if tenant == nil || !tenant.ShadowMode || !tenant.Limits[0].Shadow || tenant.Limits[0].Rule.Window != 5*time.Minute {
		t.Errorf("tenant = %+v, want a shadow 5-minute limit", tenant)
	}

	paths := []struct{ path, node string }{
		{"/api/v1/admin/users", "path=/api/v1/admin/*"},
		{"/api/v1/users?page=2", "path=/api/v1/*"},
		{"/static/app.js", "path"},
	}
	for _, p := range paths {
		if n := api.Match([]Entry{{Key: "path", Value: p.path}}); n == nil || n.Path != p.node {
			t.Errorf("Match(path=%s) = %v, want %s", p.path, n, p.node)
		}
	}
	if admin := api.Match([]Entry{{Key: "path", Value: "/api/v1/admin/x"}}); !admin.ShareThreshold {
		t.Errorf("path=/api/v1/admin/* has no share_threshold")
	}

	// http_descriptors: remote_address; api_key only with the header; path.
	client := netip.MustParseAddr("198.51.100.4")
	r := &httpdesc.StaticRequest{Client: client, Path: "/api/v1/users", Method: "GET", Headers: map[string]string{"x-api-key": "k-1"}}
	wantDescriptors := [][]Entry{
		entries("remote_address", "198.51.100.4"),
		entries("api_key", "k-1"),
		entries("path", "/api/v1/users"),
	}
	if got := api.HTTPDescriptors.Build(r, nil); !reflect.DeepEqual(got, wantDescriptors) {
		t.Errorf("HTTPDescriptors.Build(with x-api-key) = %v, want %v", got, wantDescriptors)
	}
	anonymous := &httpdesc.StaticRequest{Client: client, Path: "/"}
	wantDescriptors = [][]Entry{entries("remote_address", "198.51.100.4"), entries("path", "/")}
	if got := api.HTTPDescriptors.Build(anonymous, nil); !reflect.DeepEqual(got, wantDescriptors) {
		t.Errorf("HTTPDescriptors.Build(no x-api-key) = %v, want %v", got, wantDescriptors)
	}
}
