package httpapi

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Limits bound what HTTP clients can hold of the server. A zero field means
// its default.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers; ReadTimeout the
	// whole request, body included, so that a body trickled a byte at a time
	// cannot hold a connection. Default 10 s each.
	ReadHeaderTimeout, ReadTimeout time.Duration
	// WriteTimeout bounds writing a response (from the end of reading the
	// request), so that a client that does not read cannot hold one; it also
	// bounds a /debug/pprof profile's seconds. Default 1 minute.
	WriteTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long. Default 2
	// minutes.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers. Default 64 KiB.
	MaxHeaderBytes int
	// MaxConnections bounds the open connections. When a connection comes
	// at the bound, one open connection is closed to make room: the one
	// idle longest, else the one longest in its current state (waiting for
	// its first request byte, or reading or serving a request), so that
	// stalled and slow clients make room for new ones and a flood of
	// connections cannot take the process's file descriptors. Default 1024.
	MaxConnections int
}

// The defaults of Limits.
const (
	DefaultReadTimeout    = 10 * time.Second
	DefaultWriteTimeout   = time.Minute
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxConnections = 1024
	defaultMaxHeaderBytes = 64 << 10
)

func (l *Limits) setDefaults() {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&l.ReadHeaderTimeout, DefaultReadTimeout},
		{&l.ReadTimeout, DefaultReadTimeout},
		{&l.WriteTimeout, DefaultWriteTimeout},
		{&l.IdleTimeout, DefaultIdleTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
}

// Server is an HTTP server within Limits. Safe for concurrent use.
type Server struct {
	srv   *http.Server
	conns *connSet
}

// NewServer returns a server of h within lim. reg (when not nil) receives
// rls_http_connections and rls_http_connections_evicted_total; log gets the
// server's errors and, at a bounded rate, the evictions.
func NewServer(h http.Handler, lim Limits, log *slog.Logger, reg prometheus.Registerer) *Server {
	lim.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs := newConnSet(lim.MaxConnections, log)
	if reg != nil {
		reg.MustRegister(cs.evicted, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_http_connections",
			Help: "Open HTTP connections (bounded by --http-max-connections).",
		}, func() float64 { return float64(cs.len()) }))
	}
	return &Server{
		conns: cs,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: lim.ReadHeaderTimeout,
			ReadTimeout:       lim.ReadTimeout,
			WriteTimeout:      lim.WriteTimeout,
			IdleTimeout:       lim.IdleTimeout,
			MaxHeaderBytes:    lim.MaxHeaderBytes,
			ConnState:         cs.setState,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
}

// Serve serves connections accepted on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	return s.srv.Serve(&capListener{Listener: l, conns: s.conns})
}

// ServeTLS serves TLS connections accepted on l with cfg until Shutdown.
func (s *Server) ServeTLS(l net.Listener, cfg *tls.Config) error {
	s.srv.TLSConfig = cfg
	return s.srv.ServeTLS(&capListener{Listener: l, conns: s.conns}, "", "")
}

// Shutdown stops accepting, waits for requests in flight until ctx ends,
// and closes the connections.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// capListener makes room in conns for every connection it accepts.
type capListener struct {
	net.Listener
	conns *connSet
}

func (l *capListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.conns.add(c)
	return c, nil
}

// connSet tracks the open connections and their states, to choose the one
// to close when a new one comes at the bound. Safe for concurrent use.
type connSet struct {
	max     int
	log     *slog.Logger
	every   rate.Sometimes
	evicted prometheus.Counter

	mu    sync.Mutex
	conns map[net.Conn]*connInfo // by the connection as accepted
	seq   uint64                 // orders state changes
}

// connInfo is what connSet knows of one connection. Requires connSet.mu.
type connInfo struct {
	state http.ConnState
	since uint64 // connSet.seq when state began
}

func newConnSet(max int, log *slog.Logger) *connSet {
	return &connSet{
		max:   max,
		conns: make(map[net.Conn]*connInfo),
		log:   log,
		every: rate.Sometimes{Interval: 10 * time.Second},
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_http_connections_evicted_total",
			Help: "HTTP connections closed to make room for a new one at --http-max-connections.",
		}),
	}
}

// add registers a new connection, closing another one first when the set
// is full.
func (cs *connSet) add(c net.Conn) {
	cs.mu.Lock()
	var victim net.Conn
	if len(cs.conns) >= cs.max {
		victim = cs.victim()
		delete(cs.conns, victim)
	}
	cs.seq++
	cs.conns[c] = &connInfo{state: http.StateNew, since: cs.seq}
	cs.mu.Unlock()
	if victim != nil {
		victim.Close()
		cs.evicted.Inc()
		cs.every.Do(func() {
			cs.log.Warn("HTTP connection bound reached: closed the connection that waited longest to make room for a new one (logged once per 10s)",
				"max_connections", cs.max, "closed_peer", victim.RemoteAddr().String())
		})
	}
}

// victim returns the connection to close: the one idle longest, else the
// one that has been longest in its current state, waiting for its first
// request byte or reading or serving its request: a stalled or slow client
// before one that just came. Requires cs.mu held and the set not empty.
func (cs *connSet) victim() net.Conn {
	var best net.Conn
	var bestInfo *connInfo
	for c, info := range cs.conns {
		idle, bestIdle := info.state == http.StateIdle, best != nil && bestInfo.state == http.StateIdle
		if best == nil || (idle && !bestIdle) || (idle == bestIdle && info.since < bestInfo.since) {
			best, bestInfo = c, info
		}
	}
	return best
}

// setState is the http.Server's ConnState hook.
func (cs *connSet) setState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	info, ok := cs.conns[c]
	if !ok {
		return // closed to make room
	}
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(cs.conns, c)
	default:
		if state != info.state {
			cs.seq++
			info.state, info.since = state, cs.seq
		}
	}
}

func (cs *connSet) len() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.conns)
}
