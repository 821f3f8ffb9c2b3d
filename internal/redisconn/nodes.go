package redisconn

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeHealth is one Redis node's answer to a PING.
type NodeHealth struct {
	Addr string `json:"addr"`
	// Seconds is how long the PING took; Error why it failed.
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// PingNodes pings every master of a cluster, or the one node, each on
// its own, and says how each answered, by address. It does not use the
// pipelines: it tells whether the nodes answer, not what decisions wait.
func (c *Conn) PingNodes(ctx context.Context) []NodeHealth {
	var mu sync.Mutex
	var out []NodeHealth
	err := eachNode(ctx, c.client, func(ctx context.Context, _ string, node *redis.Client) error {
		start := time.Now()
		err := node.Ping(ctx).Err()
		h := NodeHealth{Addr: node.Options().Addr, Seconds: time.Since(start).Seconds()}
		if err != nil {
			h.Error = err.Error()
		}
		mu.Lock()
		out = append(out, h)
		mu.Unlock()
		return nil
	})
	if err != nil && len(out) == 0 { // the cluster's nodes are unknown
		out = append(out, NodeHealth{Error: err.Error()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}
