package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/decisionlog"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/topkeys"
)

// Who is limited and what a change would do: the top keys of every limit
// (GET /debug/top), published to the other processes on a Redis store,
// and the decision log. Each is an observer of the service; what runs
// beside it (the publisher, the log's writer) starts in Run and stops
// there.

// insight is the server's top keys and decision log; nil fields are off.
type insight struct {
	top *topkeys.Keys
	log *decisionlog.Log
}

// newInsight makes the top keys and the decision log of cfg, for a store
// whose Redis parts are redis; what it returns must be closed (close).
func newInsight(cfg Config, redis RedisParts, log *slog.Logger) (*insight, error) {
	in := &insight{}
	now := storeClock(cfg.Store)
	if cfg.TopKeys.K > 0 {
		opts := topkeys.Options{K: cfg.TopKeys.K, Now: now, Process: processName(), Every: cfg.TopKeys.Publish, Logger: log}
		if redis.Board != nil { // not a nil *Board in the interface
			opts.Board = redis.Board
		}
		in.top = topkeys.New(opts)
	}
	if lo := cfg.DecisionLog; lo.Path != "" {
		lo.Now, lo.Logger = now, log
		lo.Switches = decisionlog.Switches{CountDeniedHits: cfg.Service.CountDeniedHits, Shadow: cfg.Service.ShadowAll, QuotaAll: cfg.Service.QuotaAll}
		var err error
		if in.log, err = decisionlog.New(lo); err != nil {
			return nil, err
		}
		log.Info("decision log", "path", lo.Path, "sample", lo.Sample, "hashed", len(lo.HashKey) > 0)
	}
	return in, nil
}

// observers are the service's observers of in.
func (in *insight) observers() []service.Observer {
	var out []service.Observer
	if in.top != nil {
		out = append(out, in.top)
	}
	if in.log != nil {
		out = append(out, in.log)
	}
	return out
}

// close closes the decision log: what is queued is written first.
func (in *insight) close() {
	if in.log != nil {
		in.log.Close()
	}
}

// storeClock is the clock of the store's decisions where it is not
// Redis's TIME: a test's (Memory.Now, the Redis store's test seam), else
// time.Now.
func storeClock(c Store) func() time.Time {
	switch {
	case c.Kind == Memory && c.Memory.Now != nil:
		return c.Memory.Now
	case c.Kind == Redis && c.Redis.Now != nil:
		return c.Redis.Now
	}
	return time.Now
}

// processName names this process among those that share a store: its
// host, its pid and a random part (a restarted process is another).
func processName() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	name := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
			return r
		}
		return '_'
	}, name)
}
