package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Board is a small shared board on the store's Redis (its first backend):
// each process pins a note under its own id, which Redis expires unless
// it is pinned again within its ttl, and any process reads every live
// note. The processes sharing a store tell each other there what they
// see (the top keys' summaries); it holds no counter. Safe for concurrent
// use; it lives as long as the store.
//
// Keys: <prefix>board:{NAME} is the set of the ids that pinned a note,
// <prefix>board:{NAME}:ID each note (a string with a TTL); the braces put
// them in one cluster slot. A counter's key has '{' right after the
// prefix: the two never meet.
type Board struct {
	client redis.UniversalClient
	index  string // the set of ids
}

// MaxBoardNote bounds a note: Pin refuses a larger one.
const MaxBoardNote = 8 << 20

// boardBound bounds a board call whose context has no deadline.
const boardBound = 2 * time.Second

// Board returns the board called name (letters, digits, '-', '_').
func (s *Store) Board(name string) *Board {
	return &Board{client: s.backends[0].conn.Client(), index: s.opts.Prefix + "board:{" + name + "}"}
}

func (b *Board) noteKey(id string) string { return b.index + ":" + id }

// Pin puts note under id (replacing id's note) for ttl, in one round trip.
func (b *Board) Pin(ctx context.Context, id string, note []byte, ttl time.Duration) error {
	if len(note) > MaxBoardNote {
		return fmt.Errorf("redis: board %s: a note of %d bytes, more than %d", b.index, len(note), MaxBoardNote)
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	pipe := b.client.Pipeline()
	pipe.Set(ctx, b.noteKey(id), note, ttl)
	pipe.SAdd(ctx, b.index, id)
	// The index outlives every note pinned in time, and goes when every
	// process has stopped pinning.
	pipe.PExpire(ctx, b.index, 10*ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redis: board %s: pin: %w", b.index, err)
	}
	return nil
}

// Unpin takes id's note off.
func (b *Board) Unpin(ctx context.Context, id string) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	pipe := b.client.Pipeline()
	pipe.Del(ctx, b.noteKey(id))
	pipe.SRem(ctx, b.index, id)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redis: board %s: unpin: %w", b.index, err)
	}
	return nil
}

// Notes returns every live note, by id; the ids whose notes expired leave
// the index on the way.
func (b *Board) Notes(ctx context.Context) (map[string][]byte, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	ids, err := b.client.SMembers(ctx, b.index).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: board %s: %w", b.index, err)
	}
	if len(ids) == 0 {
		return map[string][]byte{}, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = b.noteKey(id)
	}
	vals, err := b.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: board %s: %w", b.index, err)
	}
	notes := make(map[string][]byte, len(ids))
	var gone []any
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			gone = append(gone, ids[i])
			continue
		}
		notes[ids[i]] = []byte(s)
	}
	if len(gone) > 0 {
		// Best effort: a process whose note expired as it pinned again
		// is missing from the index until its next pin.
		b.client.SRem(ctx, b.index, gone...)
	}
	return notes, nil
}

// bounded returns ctx, bounded by boardBound when it has no deadline.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, boardBound)
}
