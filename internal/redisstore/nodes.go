package redisstore

import (
	"context"

	"github.com/rlsproject/rls/internal/redisconn"
)

// Nodes pings every node of the store's Redis (every master of a cluster)
// and of its per-second Redis, each on its own, for an operator's view of
// their health; the per-second Redis's addresses are prefixed
// "per-second ".
func (s *Store) Nodes(ctx context.Context) []redisconn.NodeHealth {
	var out []redisconn.NodeHealth
	for _, b := range s.backends {
		for _, h := range b.conn.PingNodes(ctx) {
			if b.perSecond {
				h.Addr = "per-second " + h.Addr
			}
			out = append(out, h)
		}
	}
	return out
}
