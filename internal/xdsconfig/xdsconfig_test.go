package xdsconfig_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlsproject/rls/internal/compat"
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/testpki"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/xdsconfig"
	"github.com/rlsproject/rls/internal/xdsconfig/xdstest"
)

// waitLimit bounds every wait on the server; a healthy run takes
// milliseconds.
const waitLimit = 20 * time.Second

// target loads configs as rls does (compat.FromXDS) and keeps the
// current one, as the service would.
type target struct {
	mu      sync.Mutex
	version string
	cfg     *config.Config
	loads   map[string]int // Load calls by version
}

func (t *target) Load(version string, configs []*rlsconfv3.RateLimitConfig) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.loads == nil {
		t.loads = map[string]int{}
	}
	t.loads[version]++
	cfg, err := compat.FromXDS(config.ParseOptions{}, configs)
	if err != nil {
		return err
	}
	t.version, t.cfg = version, cfg
	return nil
}

func (t *target) state() (string, *config.Config, map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	loads := map[string]int{}
	for k, v := range t.loads {
		loads[k] = v
	}
	return t.version, t.cfg, loads
}

// egConfig is a RateLimitConfig shaped as Envoy Gateway's translator
// writes them: the listener's name as domain and name, one descriptor per
// route keyed and valued by its name, a chain per rule below it, the limit
// on the last node.
func egConfig(listener, route string, rpu uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   listener,
		Domain: listener,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: route, Value: route,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key: "rule-0-match-0", Value: "rule-0-match-0",
				Descriptors: []*rlsconfv3.RateLimitDescriptor{{
					Key:       "rule-0-match-1",
					RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu},
				}},
			}},
		}},
	}
}

const route = "httproute/default/backend/rule/0/match/0/www_example_com"

// limitOf returns "rpu/unit" of the rule's limit in cfg, for one user.
func limitOf(cfg *config.Config, domain string) string {
	if cfg == nil {
		return "no config"
	}
	n := cfg.Domain(domain).Match([]config.Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}, {Key: "rule-0-match-1", Value: "alice"}})
	if n == nil || len(n.Limits) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%s", n.Limits[0].Rule.Limit, n.Limits[0].Rule.Unit)
}

func run(t *testing.T, o xdsconfig.Options, tg xdsconfig.Target) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xdsconfig.New(o, tg).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

var fastBackoff = xdsconfig.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}

// Over mutual TLS, as Envoy Gateway runs it: the node is named, a config
// is loaded and ACKed, an update too; an invalid one is NACKed with the
// validation errors and the old one kept; the server's immediate resends of
// the refused version are NACKed again without another load; a good
// version after it loads.
func TestClientFollowsConfigsOverMutualTLS(t *testing.T) {
	pki := testpki.New(t)
	srv := xdstest.Start(t, pki.ServerTLS(t))
	clientTLS, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, ServerName: "envoy-gateway"})
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := structpb.NewStruct(map[string]any{"cluster": "eg"})
	tg := &target{}
	const domain = "default/eg/http"
	srv.Push(t, "envoy-ratelimit", "1", egConfig(domain, route, 3, rlsconfv3.RateLimitUnit_HOUR))
	run(t, xdsconfig.Options{Server: srv.Addr, NodeID: "envoy-ratelimit", NodeMetadata: meta, TLS: clientTLS, Backoff: fastBackoff,
		Headers: map[string]string{"x-tenant": "a"}}, tg)

	srv.WaitFor(t, waitLimit, "ACK of version 1", xdstest.ACKed("1"))
	if v, cfg, _ := tg.state(); v != "1" || limitOf(cfg, domain) != "3/hour" {
		t.Fatalf("after version 1: target has version %q, limit %s; want 1, 3/hour", v, limitOf(cfg, domain))
	}
	srv.WaitFor(t, waitLimit, "node", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool { return xdstest.Node(reqs) != nil })
	srv.WaitFor(t, waitLimit, "node", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool {
		n := xdstest.Node(reqs)
		if n.GetId() != "envoy-ratelimit" || n.GetMetadata().GetFields()["cluster"].GetStringValue() != "eg" {
			t.Fatalf("node = %v, want id envoy-ratelimit and metadata cluster=eg", n)
		}
		return true
	})

	srv.Push(t, "envoy-ratelimit", "2", egConfig(domain, route, 5, rlsconfv3.RateLimitUnit_MINUTE))
	srv.WaitFor(t, waitLimit, "ACK of version 2", xdstest.ACKed("2"))
	if v, cfg, _ := tg.state(); v != "2" || limitOf(cfg, domain) != "5/minute" {
		t.Fatalf("after version 2: target has version %q, limit %s; want 2, 5/minute", v, limitOf(cfg, domain))
	}

	bad := egConfig(domain, route, 5, rlsconfv3.RateLimitUnit_UNKNOWN) // a limit without a unit
	srv.Push(t, "envoy-ratelimit", "3", bad)
	var nack *discoveryv3.DiscoveryRequest
	srv.WaitFor(t, waitLimit, "three NACKs of version 3", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool {
		nacks := xdstest.NACKs(reqs)
		if len(nacks) > 0 {
			nack = nacks[0]
		}
		return len(nacks) >= 3
	})
	if got := nack.GetErrorDetail().GetMessage(); !strings.Contains(got, `RateLimitConfig "default/eg/http": descriptor "`+route+"="+route+`/rule-0-match-0=rule-0-match-0/rule-0-match-1": unit is required`) {
		t.Errorf("NACK error_detail = %q, want the validation error naming the resource and descriptor", got)
	}
	if nack.GetVersionInfo() != "2" {
		t.Errorf("NACK version_info = %q, want the last version loaded (2)", nack.GetVersionInfo())
	}
	if v, cfg, loads := tg.state(); v != "2" || limitOf(cfg, domain) != "5/minute" || loads["3"] != 1 {
		t.Errorf("after the refused version 3: target has version %q, limit %s, version 3 loaded %d times; want 2, 5/minute, once",
			v, limitOf(cfg, domain), loads["3"])
	}

	srv.Push(t, "envoy-ratelimit", "4", egConfig(domain, route, 7, rlsconfv3.RateLimitUnit_SECOND), egConfig("default/eg/https", route, 1, rlsconfv3.RateLimitUnit_DAY))
	srv.WaitFor(t, waitLimit, "ACK of version 4", xdstest.ACKed("4"))
	if v, cfg, _ := tg.state(); v != "4" || limitOf(cfg, domain) != "7/second" || limitOf(cfg, "default/eg/https") != "1/day" {
		t.Errorf("after version 4: target has version %q, limits %s and %s; want 4, 7/second and 1/day",
			v, limitOf(cfg, domain), limitOf(cfg, "default/eg/https"))
	}
}

// When the stream breaks (the server restarts), the client reconnects and
// asks with the last version it loaded.
func TestClientReconnects(t *testing.T) {
	srv := xdstest.Start(t, nil)
	addr := srv.Addr
	tg := &target{}
	srv.Push(t, "n", "1", egConfig("d", route, 3, rlsconfv3.RateLimitUnit_HOUR))
	run(t, xdsconfig.Options{Server: addr, NodeID: "n", Backoff: fastBackoff}, tg)
	srv.WaitFor(t, waitLimit, "ACK of version 1", xdstest.ACKed("1"))
	srv.Stop()

	srv2 := xdstest.StartAt(t, addr, nil)
	srv2.Push(t, "n", "2", egConfig("d", route, 9, rlsconfv3.RateLimitUnit_HOUR))
	srv2.WaitFor(t, waitLimit, "ACK of version 2 after the restart", xdstest.ACKed("2"))
	srv2.WaitFor(t, waitLimit, "first request", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool {
		if reqs[0].GetVersionInfo() != "1" || reqs[0].GetResponseNonce() != "" {
			t.Errorf("first request after the restart: version %q nonce %q, want version 1 (the last loaded) and no nonce",
				reqs[0].GetVersionInfo(), reqs[0].GetResponseNonce())
		}
		return true
	})
	if v, cfg, _ := tg.state(); v != "2" || limitOf(cfg, "d") != "9/hour" {
		t.Errorf("after the restart: version %q, limit %s; want 2, 9/hour", v, limitOf(cfg, "d"))
	}
}

// ClientTLS trusts the given CA only, and presents the client certificate
// that a server requiring one asks for.
func TestClientTLS(t *testing.T) {
	pki := testpki.New(t)
	srv := xdstest.Start(t, pki.ServerTLS(t))
	for _, tc := range []struct {
		name  string
		files tlsfiles.ClientFiles
		ok    bool
	}{
		{"CA and client certificate", tlsfiles.ClientFiles{CA: pki.CA, Cert: pki.Cert, Key: pki.Key}, true},
		{"another CA", tlsfiles.ClientFiles{CA: pki.OtherCA, Cert: pki.Cert, Key: pki.Key}, false},
		{"no client certificate", tlsfiles.ClientFiles{CA: pki.CA}, false},
		{"a name the certificate lacks", tlsfiles.ClientFiles{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, ServerName: "other"}, false},
	} {
		cfg, err := tlsfiles.Client(tc.files)
		if err != nil {
			t.Fatalf("%s: ClientTLS: %v", tc.name, err)
		}
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.Dial("tcp", srv.Addr, cfg)
		if err == nil {
			// TLS 1.3 reports a refused client certificate on the first read.
			conn.SetDeadline(time.Now().Add(waitLimit))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
			if err != nil && !strings.Contains(err.Error(), "certificate") {
				err = nil // the server's HTTP/2 preface came, or the connection was fine
			}
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: handshake error %v, want success %v", tc.name, err, tc.ok)
		}
	}
	if _, err := tlsfiles.Client(tlsfiles.ClientFiles{Cert: pki.Cert}); err == nil {
		t.Errorf("ClientTLS with a certificate and no key: no error")
	}
	if _, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: "/nonexistent/ca.crt"}); err == nil {
		t.Errorf("ClientTLS with a missing CA file: no error")
	}
}
