package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/redisconn"
)

//go:embed overrides.lua
var overridesLua string

var overridesScript = redis.NewScript(overridesLua)

// Overrides keeps the runtime overrides of limits (internal/overrides's
// Backend) on the store's Redis, beside the counters: a hash of their
// records by ID and a version in one cluster slot (engine.OverridesKey),
// each change made and announced on engine.OverridesChannel by one script
// (overrides.lua), so that every process sharing the store applies it.
// Its clock is Redis TIME (the store's test clock with Options.Now). It
// knows records as bytes, not what they say. Safe for concurrent use;
// the store's Close ends it.
type Overrides struct {
	s             *Store
	b             *backend
	hash, version string
	channel       string
	perScan       int64         // fields per HSCAN
	adminTimeout  time.Duration // bound on a call whose context has none
}

// Overrides returns the store's overrides backend (on the store's Redis,
// not the per-second one).
func (s *Store) Overrides() *Overrides {
	p := s.opts.Prefix
	return &Overrides{s: s, b: s.backends[0], hash: engine.OverridesKey(p), version: engine.OverridesVersionKey(p),
		channel: engine.OverridesChannel(p), perScan: 1000, adminTimeout: resetBound}
}

// bounded gives ctx a deadline when it has none: a call of the overrides
// never waits for Redis for ever.
func (o *Overrides) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, o.adminTimeout)
}

// run runs overrides.lua's operation op.
func (o *Overrides) run(ctx context.Context, op, id string, rec []byte) ([]any, error) {
	ctx, cancel := o.bounded(ctx)
	defer cancel()
	res, err := overridesScript.Run(ctx, o.b.conn.Client(), []string{o.hash, o.version}, op, id, rec, o.channel).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: overrides %s: %w", op, err)
	}
	if len(res) < 2 {
		return nil, fmt.Errorf("redis: overrides %s: a reply of %d values, want 2 or more", op, len(res))
	}
	return res, nil
}

// change runs a change (put, delete, purge): the record before and the
// version of the change.
func (o *Overrides) change(ctx context.Context, op, id string, rec []byte) ([]byte, uint64, error) {
	res, err := o.run(ctx, op, id, rec)
	if err != nil {
		return nil, 0, err
	}
	var prev []byte
	if s, ok := res[0].(string); ok {
		prev = []byte(s)
	}
	v, err := asInt(res[1])
	if err != nil {
		return nil, 0, fmt.Errorf("redis: overrides %s: version: %w", op, err)
	}
	return prev, uint64(v), nil
}

// asInt reads a number of a script's reply: an integer, or a string of
// one (TIME's).
func asInt(x any) (int64, error) {
	switch x := x.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("%v is not a number", x)
}

// Put keeps rec at id (overrides.Backend).
func (o *Overrides) Put(ctx context.Context, id string, rec []byte) ([]byte, uint64, error) {
	return o.change(ctx, "put", id, rec)
}

// Delete removes id (overrides.Backend).
func (o *Overrides) Delete(ctx context.Context, id string) ([]byte, uint64, error) {
	return o.change(ctx, "delete", id, nil)
}

// Purge removes id if its record is still rec (overrides.Backend).
func (o *Overrides) Purge(ctx context.Context, id string, rec []byte) (uint64, error) {
	_, v, err := o.change(ctx, "purge", id, rec)
	return v, err
}

// Poll returns the version and Redis's clock (overrides.Backend).
func (o *Overrides) Poll(ctx context.Context) (uint64, time.Time, error) {
	res, err := o.run(ctx, "poll", "", nil)
	if err != nil {
		return 0, time.Time{}, err
	}
	if len(res) != 3 {
		return 0, time.Time{}, fmt.Errorf("redis: overrides poll: a reply of %d values, want 3", len(res))
	}
	var nums [3]int64
	for i, x := range res {
		if nums[i], err = asInt(x); err != nil {
			return 0, time.Time{}, fmt.Errorf("redis: overrides poll: %w", err)
		}
	}
	now := time.Unix(nums[1], nums[2]*1000)
	if o.s.opts.Now != nil {
		now = o.s.opts.Now() // the store's test clock
	}
	return uint64(nums[0]), now, nil
}

// Get returns the record of id, nil for none (overrides.Backend).
func (o *Overrides) Get(ctx context.Context, id string) ([]byte, error) {
	ctx, cancel := o.bounded(ctx)
	defer cancel()
	b, err := o.b.conn.Client().HGet(ctx, o.hash, id).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("redis: overrides get: %w", err)
	}
	return b, nil
}

// Load returns every record and their version (overrides.Backend): the
// version first, then the hash a thousand fields at a time (HSCAN), so
// that many overrides never hold Redis for long. A change made during
// the scan may or may not show; its notice follows, with a later version.
func (o *Overrides) Load(ctx context.Context) (map[string][]byte, uint64, error) {
	ctx, cancel := o.bounded(ctx)
	defer cancel()
	c := o.b.conn.Client()
	v, err := c.Get(ctx, o.version).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("redis: overrides version: %w", err)
	}
	out := make(map[string][]byte)
	var cursor uint64
	for {
		kv, next, err := c.HScan(ctx, o.hash, cursor, "", o.perScan).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("redis: reading the overrides: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = []byte(kv[i+1])
		}
		if cursor = next; cursor == 0 {
			return out, v, nil
		}
	}
}

// Watch follows the notices of changes until ctx ends or the
// subscription fails (overrides.Backend).
func (o *Overrides) Watch(ctx context.Context, notice func(version uint64, id string), subscribed func()) error {
	ps := o.b.conn.Client().Subscribe(ctx, o.channel)
	defer ps.Close()
	stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a blocked read
	defer stop()
	moved := o.b.conn.OnMasterMove(func() { ps.Close() }) // a failover: subscribe on the new master
	defer moved()
	err := redisconn.Receive(ctx, ps, freedPing, func(msg any) {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				subscribed()
			}
		case *redis.Message:
			vs, id, ok := strings.Cut(m.Payload, " ")
			if v, err := strconv.ParseUint(vs, 10, 64); ok && err == nil {
				notice(v, id)
			}
		}
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}
