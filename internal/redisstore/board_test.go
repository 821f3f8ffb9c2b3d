package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
)

// TestBoardNotesExpire: each process's note is kept for the TTL it pins
// it with (the index for ten times that); Notes gives every live note; a
// note that Redis expired (its process stopped pinning) leaves Notes and
// the index; Unpin takes a note off at once; a note too large is refused.
func TestBoardNotesExpire(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Prefix: "b:"})
	b := s.Board("top")
	ctx := context.Background()
	do := func(args ...string) string {
		t.Helper()
		out, err := redistest.Command(srv.Addr(), args...)
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	pttl := func(key string) time.Duration {
		t.Helper()
		ms, err := strconv.Atoi(do("PTTL", key))
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ms) * time.Millisecond
	}
	notes := func() map[string]string {
		t.Helper()
		n, err := b.Notes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for id, note := range n {
			out[id] = string(note)
		}
		return out
	}
	const ttl = 30 * time.Second
	for _, id := range []string{"p1", "p2", "p3"} {
		if err := b.Pin(ctx, id, []byte("note of "+id), ttl); err != nil {
			t.Fatal(err)
		}
	}
	if got := pttl("b:board:{top}:p1"); got <= 0 || got > ttl {
		t.Errorf("PTTL of p1's note = %s, want in (0, %s]", got, ttl)
	}
	if got := pttl("b:board:{top}"); got <= ttl || got > 10*ttl {
		t.Errorf("PTTL of the index = %s, want in (%s, %s]", got, ttl, 10*ttl)
	}
	if got := notes(); len(got) != 3 || got["p2"] != "note of p2" {
		t.Fatalf("Notes() = %v, want p1, p2 and p3", got)
	}
	// p2 stops pinning: Redis expires its note.
	do("PEXPIRE", "b:board:{top}:p2", "1")
	for i := 0; do("EXISTS", "b:board:{top}:p2") != "0"; i++ {
		if i == 1000 {
			t.Fatal("Redis did not expire p2's note")
		}
		time.Sleep(time.Millisecond) // waits for Redis's expiry, measures nothing
	}
	if got := notes(); len(got) != 2 || got["p2"] != "" {
		t.Errorf("Notes() after p2's note expired = %v, want p1 and p3", got)
	}
	if members := do("SMEMBERS", "b:board:{top}"); strings.Contains(members, "p2") {
		t.Errorf("the index still holds p2 after Notes saw its note expired: %q", members)
	}
	if err := b.Unpin(ctx, "p3"); err != nil {
		t.Fatal(err)
	}
	if got := notes(); len(got) != 1 || got["p1"] != "note of p1" {
		t.Errorf("Notes() after Unpin(p3) = %v, want p1 alone", got)
	}
	if err := b.Pin(ctx, "p4", make([]byte, MaxBoardNote+1), ttl); err == nil {
		t.Errorf("Pin of %d bytes: nil error, want a refusal", MaxBoardNote+1)
	}
}
