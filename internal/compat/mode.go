package compat

import (
	"crypto/tls"
	"net"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
)

// Mode is the name of the compatibility mode (rls serve --compat
// envoy-ratelimit).
const Mode = "envoy-ratelimit"

// ProgramName is the program name under which rls starts in that mode, as
// images that run /bin/ratelimit (Envoy Gateway) call it.
const ProgramName = "ratelimit"

// FromEnv reads envoyproxy/ratelimit's environment (NAME=value items;
// reference §1.6) into a server's Config: rls's defaults (daemon.Defaults)
// for what the environment does not say, the reference's settings, and
// what the mode plugs in: its stats and answer rules, its config source
// (the runtime directory, or an xDS server), its debug and Prometheus
// listeners. A variable rls refuses or cannot read stops it with an error
// naming the variable (`NAME="value": why`).
func FromEnv(env []string) (daemon.Config, error) {
	s, err := readEnv(env)
	if err != nil {
		return daemon.Config{}, err
	}
	return s.config(), nil
}

// config is the server's Config of s.
func (s *settings) config() daemon.Config {
	c := daemon.Defaults()
	c.Names = daemon.Names{GRPCAddr: "GRPC_HOST:GRPC_PORT", HTTPAddr: "HOST:PORT"}
	c.Logging = daemon.Logging{Level: s.logLevel, Format: s.logFormat}

	l := &c.Listeners
	l.HTTPAddr = net.JoinHostPort(s.host, s.port)
	l.GRPCAddr = net.JoinHostPort(s.grpcHost, s.grpcPort)
	l.GRPC.MaxConnectionAge, l.GRPC.MaxConnectionAgeGrace = s.grpcMaxConnectionAge, s.grpcMaxConnectionAgeGrace
	if s.grpcServerUseTLS {
		// The HTTP listener stays plain text, as in the reference.
		l.TLS = daemon.TLS{Files: tlsfiles.Files{Cert: s.grpcServerTLSCert, Key: s.grpcServerTLSKey, ClientCA: s.grpcClientTLSCACert}, GRPC: true}
		if san := s.clientSAN; san != "" {
			c.Plugins.GRPCTLS = func(base *tls.Config) *tls.Config { return withClientSAN(base, san) }
		}
	}

	c.Files.Limits.Parse = ParseOptions(s.mergeDomainConfig)
	if s.configType == "GRPC_XDS_SOTW" {
		c.Files.Path, c.Files.Watch = "", false
		c.Plugins.Source = &xdsSource{opts: s.xds, forceStart: s.forceStart, limits: c.Files.Limits}
	} else {
		c.Files.Path, c.Files.Watch = filepath.Join(s.runtimeRoot, s.runtimeSubdirectory, s.runtimeAppDirectory), true
		c.Plugins.Source = newRuntimeDir(c.Files)
	}

	c.Store.Kind = daemon.Redis
	r := &c.Store.Redis
	o := s.redisOpts
	r.URL, r.ClusterSeeds, r.Sentinel, r.PoolSize = o.URL, o.ClusterSeeds, o.Sentinel, o.PoolSize
	r.CAFile, r.CertFile, r.KeyFile, r.TLSSkipHostname = o.CAFile, o.CertFile, o.KeyFile, o.TLSSkipHostname
	r.PerSecond = s.perSecondOpts
	if s.cacheKeyPrefix != "" {
		r.Prefix = s.cacheKeyPrefix
	}
	// The local cache: on above 0 bytes, holding what that memory holds.
	r.DenyCache, r.DenyCacheSize = s.localCacheSize > 0, 0
	if r.DenyCache {
		r.DenyCacheSize = denyCacheEntries(s.localCacheSize)
	}

	// Denied hits count, as in the reference, unless the operator asked
	// for the reference's partial stop: then rls's own rule, under which a
	// denied request consumes nothing at all.
	c.Service.CountDeniedHits = !s.stopCacheKeyIncrement
	c.Service.QuotaAll = s.quotaMode
	c.Service.Headers = service.HeadersOff

	if s.tracingOn {
		c.Tracing = s.tracing
	}

	c.Plugins.Start = s.start
	c.Plugins.Listeners = append(c.Plugins.Listeners, daemon.Listener{
		Name: "DEBUG_HOST:DEBUG_PORT", Addr: net.JoinHostPort(s.debugHost, s.debugPort), Handler: debugHandler,
	})
	if s.usePrometheus {
		c.Plugins.Listeners = append(c.Plugins.Listeners, daemon.Listener{
			Name: "PROMETHEUS_ADDR", Addr: s.promAddr, Handler: prometheusHandler(s.promPath, s.extraTags),
		})
	}
	return c
}

// answers are the answer rules the environment asks for.
func (s *settings) answers() Answers {
	a := Answers{Shadow: s.shadowMode, DynamicMetadata: s.dynamicMetadata}
	if s.limitHeaders {
		names := s.limitHeaderNames
		a.LimitHeaders = &names
	}
	return a
}

// start is the mode's daemon Plugins.Start: the reference's stats (and, on
// a Redis store with the denial cache, its local cache's gauges), its
// StatsD sink, its answer rules, and the log of the variables rls ignores.
func (s *settings) start(p daemon.Parts) (daemon.Hooks, error) {
	cache := p.Redis.DenyCache
	var localCache []prometheus.Collector
	if cache != nil {
		localCache = localCacheCollectors(cache)
		p.Registry.MustRegister(localCache...)
	}
	st := NewStats(p.Registry, StatsOptions{NearLimitRatio: s.nearLimitRatio, MaxValues: p.Service.MaxValueSeries, LocalCache: cache != nil})
	hooks := daemon.Hooks{Observers: []service.Observer{st}}
	if o := s.statsd; o != nil {
		// The sink reads the reference's stats alone.
		ref := prometheus.NewRegistry()
		ref.MustRegister(st.all...)
		ref.MustRegister(localCache...)
		sink := newStatsdSink(*o, ref, p.Registry, p.Logger)
		hooks.Tasks = append(hooks.Tasks, sink.run)
		p.Logger.Info("stats", "sink", o.sinkName(), "network", o.network, "addr", o.addr, "flush_interval", o.interval.String())
	}
	if a := s.answers(); a.Shadow || a.DynamicMetadata || a.LimitHeaders != nil {
		a.Stats = st
		hooks.AnswerRules = append(hooks.AnswerRules, &a)
	}
	for _, v := range s.ignored {
		p.Logger.Info("environment variable ignored", "variable", v)
	}
	return hooks, nil
}

// ReferenceStats is a daemon Plugins.Start that exports envoyproxy/ratelimit's
// per-limit stats (Stats) on /metrics beside rls's own: rls's
// --reference-stats.
func ReferenceStats(p daemon.Parts) (daemon.Hooks, error) {
	st := NewStats(p.Registry, StatsOptions{MaxValues: p.Service.MaxValueSeries, LocalCache: p.Redis.DenyCache != nil})
	return daemon.Hooks{Observers: []service.Observer{st}}, nil
}

// The reference's local cache is a freecache of LOCAL_CACHE_SIZE_IN_BYTES
// bytes, which freecache raises to 512 KiB at least. rls's denial cache is
// bounded in entries: the same memory holds size / denyCacheEntryBytes of
// them. One entry takes about 160 bytes and its key (a descriptor key with
// hashed long values: 60 to 120 bytes for Envoy Gateway's route names):
// measured with runtime.MemStats over 200000 entries, Go 1.26, amd64: 160
// bytes plus the key's length.
const (
	freecacheMinBytes   = 512 << 10
	denyCacheEntryBytes = 256
)

// denyCacheEntries is the denial cache's bound in entries for
// LOCAL_CACHE_SIZE_IN_BYTES of n > 0 bytes.
func denyCacheEntries(n int) int {
	return max(n, freecacheMinBytes) / denyCacheEntryBytes
}
