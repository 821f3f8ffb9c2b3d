package httpapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/servetest"
)

// startServer serves h within lim on a loopback listener and returns the
// server and its address; it is shut down when the test ends.
func startServer(t *testing.T, h http.Handler, lim Limits) (*Server, string) {
	t.Helper()
	l := servetest.Listen(t)
	s := NewServer(h, lim, nil, prometheus.NewRegistry())
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
	return s, l.Addr().String()
}

// testHandler answers GET /ok at once and reads the whole body of POST
// /slow; bodyErrs receives what reading a body returned.
func testHandler(bodyErrs chan<- error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("POST /slow", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if bodyErrs != nil {
			bodyErrs <- err
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	return mux
}

// slowRequest opens a connection and sends the headers of a POST with a
// 1000-byte body and 2 bytes of it, then nothing.
func slowRequest(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: rls\r\nContent-Length: 1000\r\n\r\nab"); err != nil {
		t.Fatal(err)
	}
	return c
}

// get asks GET /ok on a connection of its own.
func get(addr string) (int, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/ok")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestConnectionBoundUnderSlowClients: more stalled requests than the
// connection bound; each new connection makes room by closing the one
// stalled longest, so the open connections stay within the bound and
// normal clients are all served.
func TestConnectionBoundUnderSlowClients(t *testing.T) {
	const max, slow, normal = 8, 40, 10
	s, addr := startServer(t, testHandler(nil), Limits{MaxConnections: max})
	for range slow {
		slowRequest(t, addr)
	}
	evicted := func() int { return int(testutil.ToFloat64(s.conns.evicted)) }
	servetest.Eventually(t, "the server accepted every slow connection", func() bool {
		return s.conns.len() == max && evicted() == slow-max
	})
	for i := range normal {
		if code, err := get(addr); err != nil || code != 200 {
			t.Errorf("normal request %d with %d stalled requests at a bound of %d: %d %v, want 200", i, slow, max, code, err)
		}
	}
	if n := s.conns.len(); n > max {
		t.Errorf("%d open connections, want at most %d", n, max)
	}
	if got := evicted(); got <= slow-max {
		t.Errorf("%d connections closed to make room, want more than the %d before the normal requests", got, slow-max)
	}
}

// TestVictimOrder: at the bound the idle connection goes first, then the one
// longest in its state, waiting for its first byte or busy.
func TestVictimOrder(t *testing.T) {
	cs := newConnSet(3, slog.New(slog.DiscardHandler))
	conn := func(name string) net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return namedConn{a, name}
	}
	busyOld, busyNew, fresh, idle := conn("busy-old"), conn("busy-new"), conn("fresh"), conn("idle")
	for i, step := range []struct {
		add  net.Conn
		set  map[net.Conn]http.ConnState
		gone string // the connection closed to make room, "" for none
	}{
		{add: busyOld, set: map[net.Conn]http.ConnState{busyOld: http.StateActive}},
		{add: busyNew, set: map[net.Conn]http.ConnState{busyNew: http.StateActive}},
		{add: idle, set: map[net.Conn]http.ConnState{idle: http.StateIdle}},
		{add: fresh, gone: "idle"},
		{add: conn("next"), gone: "busy-old"},
		{add: conn("then"), set: map[net.Conn]http.ConnState{fresh: http.StateActive}, gone: "busy-new"},
		{add: conn("last"), gone: "next"}, // fresh became busy after next came
	} {
		before := map[net.Conn]bool{}
		for c := range cs.conns {
			before[c] = true
		}
		cs.add(step.add)
		for c, st := range step.set {
			cs.setState(c, st)
		}
		gone := ""
		for c := range before {
			if _, ok := cs.conns[c]; !ok {
				gone = c.(namedConn).name
			}
		}
		if gone != step.gone || len(cs.conns) > cs.max {
			t.Errorf("step %d: adding %s closed %q (%d open), want %q closed and at most %d open", i, step.add.(namedConn).name, gone, len(cs.conns), step.gone, cs.max)
		}
	}
}

type namedConn struct {
	net.Conn
	name string
}

// TestSlowBodyCutOff: a body trickled slower than ReadTimeout allows is cut
// off (the handler's read fails, the client gets its connection closed),
// and a normal client is served.
func TestSlowBodyCutOff(t *testing.T) {
	bodyErrs := make(chan error, 1)
	_, addr := startServer(t, testHandler(bodyErrs), Limits{ReadTimeout: 100 * time.Millisecond})
	c := slowRequest(t, addr)
	if err := <-bodyErrs; err == nil {
		t.Fatal("reading a stalled body succeeded, want it cut off by the read timeout")
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the stalled request got %d, want 400 or a closed connection", resp.StatusCode)
	}
	if code, err := get(addr); err != nil || code != 200 {
		t.Errorf("a normal request after the cut-off: %d %v", code, err)
	}
}

// TestClientNotReading: a response that the client does not read is given
// up at WriteTimeout; the handler returns and a normal client is served.
func TestClientNotReading(t *testing.T) {
	wrote := make(chan error, 1)
	big := strings.Repeat("x", 1<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			io.WriteString(w, "ok")
			return
		}
		var err error
		for i := 0; i < 64 && err == nil; i++ { // 64 MiB: more than any socket buffer
			_, err = io.WriteString(w, big)
		}
		wrote <- err
	})
	_, addr := startServer(t, h, Limits{WriteTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /big HTTP/1.1\r\nHost: rls\r\n\r\n") // and never read
	if err := <-wrote; err == nil {
		t.Fatal("writing 64 MiB to a client that reads nothing succeeded, want the write timeout")
	}
	if code, err := get(addr); err != nil || code != 200 {
		t.Errorf("a normal request while a client does not read: %d %v", code, err)
	}
}

// TestIdleConnectionClosed: a keep-alive connection idle for IdleTimeout is
// closed by the server.
func TestIdleConnectionClosed(t *testing.T) {
	s, addr := startServer(t, testHandler(nil), Limits{IdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /ok HTTP/1.1\r\nHost: rls\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /ok: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if _, err := br.ReadByte(); err == nil {
		t.Error("the idle connection got more bytes, want it closed")
	}
	servetest.Eventually(t, "the server forgets the closed connection", func() bool { return s.conns.len() == 0 })
}

// TestTLSConnectionsTracked: over TLS too, the server knows which
// connections are open (the http.Server sees them as *tls.Conn), so that
// closed ones leave the bound's count.
func TestTLSConnectionsTracked(t *testing.T) {
	borrowed := httptest.NewUnstartedServer(nil)
	borrowed.StartTLS() // for its test certificate
	cert := borrowed.TLS.Certificates
	borrowed.Close()

	l := servetest.Listen(t)
	s := NewServer(testHandler(nil), Limits{MaxConnections: 4}, nil, nil)
	done := make(chan error, 1)
	go func() { done <- s.ServeTLS(l, &tls.Config{Certificates: cert}) }()
	t.Cleanup(func() { s.Shutdown(context.Background()); <-done })

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
	for i := range 10 {
		resp, err := client.Get("https://" + l.Addr().String() + "/ok")
		if err != nil {
			t.Fatalf("HTTPS request %d: %v", i, err)
		}
		resp.Body.Close()
	}
	servetest.Eventually(t, "the closed TLS connections leave the set", func() bool { return s.conns.len() == 0 })
	if got := testutil.ToFloat64(s.conns.evicted); got != 0 {
		t.Errorf("%v connections closed to make room, want 0: 10 requests one after the other never exceed 4", got)
	}
}
