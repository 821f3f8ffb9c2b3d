package rlqs

import (
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/peer"
)

// The listing bounds of Streams: what an operator's page can show, not
// what the server holds (MaxStreams, MaxBuckets).
const (
	MaxListedStreams = 100
	MaxListedBuckets = 20
)

// StreamStatus is one RLQS stream served now, as GET /debug/status shows
// it.
type StreamStatus struct {
	// Peer is the client's address; Domain the one its first report
	// named ("" before it).
	Peer   string    `json:"peer"`
	Domain string    `json:"domain"`
	Since  time.Time `json:"since"`
	// Buckets are its buckets by id (at most MaxListedBuckets, the
	// first by id); MoreBuckets counts the others.
	Buckets     []BucketStatus `json:"buckets"`
	MoreBuckets int            `json:"more_buckets,omitempty"`
}

// BucketStatus is one bucket of a stream.
type BucketStatus struct {
	ID map[string]string `json:"id"`
	// Action is the last action sent for it: none, allow_all, deny_all,
	// token_bucket or abandon.
	Action string `json:"action"`
	// Limits are the labels of the limits its assignments are sized by.
	Limits []string `json:"limits,omitempty"`
}

// actionNames are the names of the kinds of action, as
// rls_rlqs_actions_total writes them.
var actionNames = map[sent]string{sentNothing: "none", sentAllowAll: actionAllowAll, sentDenyAll: actionDenyAll,
	sentTokenBucket: actionTokenBucket, sentAbandon: actionAbandon}

// track adds ss, the session of a stream of ctx's peer, to the streams
// Streams lists; untrack removes it.
func (s *Server) track(ss *Session, p *peer.Peer) {
	st := StreamStatus{Since: s.opts.Now()}
	if p != nil && p.Addr != nil {
		st.Peer = p.Addr.String()
	}
	s.mu.Lock()
	s.live[ss] = st
	s.mu.Unlock()
}

func (s *Server) untrack(ss *Session) {
	s.mu.Lock()
	delete(s.live, ss)
	s.mu.Unlock()
}

// Streams returns the streams served now (at most MaxListedStreams, the
// oldest first), with their buckets. Safe for concurrent use.
func (s *Server) Streams() []StreamStatus {
	type one struct {
		ss *Session
		st StreamStatus
	}
	s.mu.Lock()
	all := make([]one, 0, len(s.live))
	for ss, st := range s.live {
		all = append(all, one{ss, st})
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b one) int { return a.st.Since.Compare(b.st.Since) })
	out := make([]StreamStatus, 0, min(len(all), MaxListedStreams))
	for _, o := range all[:min(len(all), MaxListedStreams)] {
		out = append(out, o.ss.status(o.st))
	}
	return out
}

// status fills st with what ss holds now.
func (ss *Session) status(st StreamStatus) StreamStatus {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st.Domain = ss.domain
	keys := slices.Sorted(maps.Keys(ss.buckets))
	st.Buckets = []BucketStatus{}
	for _, k := range keys[:min(len(keys), MaxListedBuckets)] {
		b := ss.buckets[k]
		bs := BucketStatus{ID: maps.Clone(b.id.GetBucket()), Action: actionNames[b.sent]}
		for _, l := range b.limits {
			bs.Limits = append(bs.Limits, l.Label)
		}
		st.Buckets = append(st.Buckets, bs)
	}
	st.MoreBuckets = len(keys) - len(st.Buckets)
	return st
}
