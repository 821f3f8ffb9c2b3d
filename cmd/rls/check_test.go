package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestCheckQuickstart: the README's first loop, with rls check against a
// served config/limits.yaml (10 per second per address; the memory store's
// clock stands still): ten OK lines, then OVER_LIMIT and exit status 1.
func TestCheckQuickstart(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	var out bytes.Buffer
	err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "-n", "11", "api", "remote_address=203.0.113.7"}, nil, &out, io.Discard)
	if exitCode(err) != checkOverLimit || err.Error() != "" {
		t.Errorf("rls check -n 11 = %v (exit %d), want exit %d and nothing more to say", err, exitCode(err), checkOverLimit)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 11 {
		t.Fatalf("rls check -n 11 printed %d lines, want 11:\n%s", len(lines), out.String())
	}
	for i, line := range lines {
		want := fmt.Sprintf("%d OK: OK 10/second remaining=%d reset=1s", i+1, 9-i)
		if i == 10 {
			want = "11 OVER_LIMIT: OVER_LIMIT 10/second remaining=0 reset=1s"
		}
		if line != want {
			t.Errorf("line %d = %q, want %q", i+1, line, want)
		}
	}
	// Within the limit: exit 0.
	out.Reset()
	if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "-n", "2", "api", "remote_address=203.0.113.8"}, nil, &out, io.Discard); err != nil {
		t.Errorf("rls check -n 2 on a fresh address = %v, want success", err)
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestCheckOneConnection: the requests of one rls check share one
// connection; several descriptors print one status each.
func TestCheckOneConnection(t *testing.T) {
	svc := servetest.Service(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100, name: per_a}
  - key: b
    rate_limit: {unlimited: true}
`, service.Options{})
	l := &countingListener{Listener: servetest.Listen(t)}
	gs := grpc.NewServer(append(grpcserver.Options(grpcserver.Limits{}), envoyrls.ServerCodec())...)
	envoyrls.New(svc).Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(l) }()
	t.Cleanup(func() { gs.Stop(); <-done })

	var out bytes.Buffer
	if err := run(context.Background(), []string{"check", "--addr", l.Addr().String(), "-n", "5", "--hits", "2", "d", "a=1", "b=x", "c=y,e=z"}, nil, &out, io.Discard); err != nil {
		t.Fatalf("rls check = %v", err)
	}
	if got := l.n.Load(); got != 1 {
		t.Errorf("5 requests took %d connections, want 1", got)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if want := `5 OK: OK 100/minute "per_a" remaining=90 reset=60s; OK unlimited; OK no limit`; len(lines) != 5 || lines[4] != want {
		t.Errorf("rls check printed:\n%s\nwant 5 lines, the last %q", out.String(), want)
	}
}

// TestCheckTokenBucketLine: rls check prints current_limit, which for a
// token bucket is its burst (the audit's {1/s, burst 3} printed "1/second
// remaining=2"): what remains is never more than the limit printed, and
// the unit is the shortest whole one its bucket fills within (3 s: a
// minute), as Envoy reads it.
func TestCheckTokenBucketLine(t *testing.T) {
	svc := servetest.Service(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
`, service.Options{})
	cc := servetest.GRPC(t, envoyrls.New(svc).Register, append(grpcserver.Options(grpcserver.Limits{}), envoyrls.ServerCodec())...)
	var out bytes.Buffer
	err := run(context.Background(), []string{"check", "--addr", cc.Target(), "-n", "4", "d", "a=1"}, nil, &out, io.Discard)
	if exitCode(err) != checkOverLimit {
		t.Errorf("rls check -n 4 = %v, want exit %d (the fourth is over)", err, checkOverLimit)
	}
	want := "1 OK: OK 3/minute remaining=2 reset=1s\n" +
		"2 OK: OK 3/minute remaining=1 reset=2s\n" +
		"3 OK: OK 3/minute remaining=0 reset=3s\n" +
		"4 OVER_LIMIT: OVER_LIMIT 3/minute remaining=0 reset=1s\n"
	if out.String() != want {
		t.Errorf("rls check printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestCheckErrors: a bad command line exits 2, a request that fails 3.
func TestCheckErrors(t *testing.T) {
	down := servetest.Addr(t) // nothing listens there
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check"}, 2, "want DOMAIN and at least one DESCRIPTOR"},
		{[]string{"check", "api"}, 2, "want DOMAIN and at least one DESCRIPTOR"},
		{[]string{"check", "api", "novalue"}, 2, `descriptor "novalue": entries are key=value`},
		{[]string{"check", "-n", "0", "api", "k=v"}, 2, "-n 0"},
		{[]string{"check", "--tls-cert", "x.pem", "api", "k=v"}, 2, "--tls-cert and --tls-key go together"},
		{[]string{"check", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"check", "--addr", down, "--timeout", "5s", "api", "k=v"}, checkFailed, "request 1"},
	} {
		err := run(context.Background(), tc.args, nil, io.Discard, io.Discard)
		if err == nil || exitCode(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rls %v = %v (exit %d), want exit %d mentioning %q", tc.args, err, exitCode(err), tc.code, tc.want)
		}
	}
	// A request the server refuses is a failed request too.
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "api", "=v"}, nil, io.Discard, io.Discard)
	if err == nil || exitCode(err) != 2 {
		t.Errorf("rls check api =v = %v (exit %d), want exit 2 (an entry needs a key)", err, exitCode(err))
	}
	big := strings.Repeat("k=v,", 17) + "k=v"
	err = run(context.Background(), []string{"check", "--addr", s.grpcAddr, "api", big}, nil, io.Discard, io.Discard)
	if exitCode(err) != checkFailed || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Errorf("rls check with 18 entries = %v (exit %d), want exit %d with the server's InvalidArgument", err, exitCode(err), checkFailed)
	}
}
