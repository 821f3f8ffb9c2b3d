package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/proctest"
)

// Cluster is a Redis Cluster of redis-server processes on 127.0.0.1.
type Cluster struct {
	Nodes []*Server
	// Proxies, in a proxied cluster, stand in front of Nodes (same index):
	// the nodes announce them to clients, so that every client connection
	// goes through one.
	Proxies []*FaultProxy
	tb      testing.TB
}

// StartCluster starts masters × (1 + replicas) cluster-enabled servers,
// joins them with redis-cli --cluster create, waits until every node says
// cluster_state:ok, and stops them all when the test ends.
func StartCluster(tb testing.TB, masters, replicas int) *Cluster {
	tb.Helper()
	return startCluster(tb, masters, replicas, false)
}

// StartProxiedCluster is StartCluster with a FaultProxy in front of each
// node, which the node announces as its address: faults on a proxy are
// faults on every client connection to its node (the cluster bus between
// nodes is not proxied).
func StartProxiedCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	return startCluster(tb, masters, 0, true)
}

func startCluster(tb testing.TB, masters, replicas int, proxied bool) *Cluster {
	tb.Helper()
	bin, cli := serverBinary(tb), cliBinary(tb)
	c := &Cluster{tb: tb}
	n := masters * (1 + replicas)
	for range n {
		s := &Server{dir: tb.TempDir(), port: proctest.Port(tb), tb: tb}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.args = proctest.RedisArgs(s.port, s.dir,
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
		)
		if proxied {
			proxy := StartFaultProxy(tb, s.addr)
			c.Proxies = append(c.Proxies, proxy)
			s.args = append(s.args, "--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", strconv.Itoa(proxy.Port()),
				"--cluster-announce-bus-port", strconv.Itoa(s.port+10000))
		}
		s.start(bin)
		tb.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.addr) // the nodes' own addresses: they meet on their bus ports
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy()
	return c
}

// Seeds returns every node's host:port, as clients reach it (its proxy's
// in a proxied cluster).
func (c *Cluster) Seeds() []string {
	var s []string
	for i, n := range c.Nodes {
		if c.Proxies != nil {
			s = append(s, c.Proxies[i].Addr())
			continue
		}
		s = append(s, n.addr)
	}
	return s
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// agrees on the slots (bounded: 30s).
func (c *Cluster) WaitHealthy() {
	c.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		bad := ""
		for _, n := range c.Nodes {
			info, err := Command(n.addr, "CLUSTER", "INFO")
			if err != nil {
				continue // stopped node
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				bad = n.addr
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			info, _ := Command(bad, "CLUSTER", "INFO")
			c.tb.Fatalf("redistest: cluster not healthy within 30s; %s says:\n%s", bad, info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Master returns the node that serves slot now.
func (c *Cluster) Master(slot int) *Server {
	c.tb.Helper()
	for _, n := range c.Nodes {
		out, err := Command(n.addr, "CLUSTER", "SLOTS")
		if err != nil {
			continue
		}
		// Lines: start, end, ip, port, id, ... per range, flattened.
		lines := strings.Split(out, "\n")
		for i := 0; i+3 < len(lines); i++ {
			start, e1 := strconv.Atoi(lines[i])
			end, e2 := strconv.Atoi(lines[i+1])
			port, e3 := strconv.Atoi(lines[i+3])
			if e1 != nil || e2 != nil || e3 != nil || lines[i+2] != "127.0.0.1" || start > end || end > 16383 {
				continue
			}
			if slot >= start && slot <= end {
				for i, m := range c.Nodes {
					if m.port == port || c.Proxies != nil && c.Proxies[i].Port() == port {
						return m
					}
				}
			}
		}
		break
	}
	c.tb.Fatalf("redistest: no master for slot %d", slot)
	return nil
}

// KeySlot asks the cluster for a key's slot.
func (c *Cluster) KeySlot(key string) int {
	c.tb.Helper()
	for _, n := range c.Nodes {
		out, err := Command(n.addr, "CLUSTER", "KEYSLOT", key)
		if err == nil {
			slot, _ := strconv.Atoi(out)
			return slot
		}
	}
	c.tb.Fatal("redistest: no node answers CLUSTER KEYSLOT")
	return 0
}

// LogTail returns the end of a node's log, for failure messages.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("--- %s ---\n%s", s.addr, b)
}

// ID returns the cluster node ID of n (CLUSTER MYID).
func (c *Cluster) ID(n *Server) string {
	c.tb.Helper()
	id, err := Command(n.addr, "CLUSTER", "MYID")
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER MYID on %s: %v", n.addr, err)
	}
	return id
}

// Migration moves one slot from its master to another, step by step, as
// redis-cli --cluster reshard does: the slot is IMPORTING on To and
// MIGRATING on From (StartMigration), keys are moved a few at a time
// (Move), and the slot is given to To (Finish). Meanwhile From answers ASK
// for the slot's keys it no longer has, and TRYAGAIN for commands of
// several keys some of which it no longer has.
type Migration struct {
	Slot     int
	From, To *Server
	c        *Cluster
}

// StartMigration opens the migration of slot from its master to to.
func (c *Cluster) StartMigration(slot int, to *Server) *Migration {
	c.tb.Helper()
	m := &Migration{Slot: slot, From: c.Master(slot), To: to, c: c}
	if m.From == to {
		c.tb.Fatalf("redistest: slot %d is on %s already", slot, to.addr)
	}
	s := strconv.Itoa(slot)
	m.do(to, "CLUSTER", "SETSLOT", s, "IMPORTING", c.ID(m.From))
	m.do(m.From, "CLUSTER", "SETSLOT", s, "MIGRATING", c.ID(to))
	return m
}

// Move moves keys (of the slot) from From to To in one MIGRATE: atomic
// for them together.
func (m *Migration) Move(keys ...string) {
	m.c.tb.Helper()
	host, port, _ := net.SplitHostPort(m.To.addr)
	args := append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)
	m.do(m.From, args...)
}

// Finish gives the slot to To on every master (To first, then From, as
// redis-cli does) and waits until every node agrees that To serves it.
func (m *Migration) Finish() {
	m.c.tb.Helper()
	s, id := strconv.Itoa(m.Slot), m.c.ID(m.To)
	m.do(m.To, "CLUSTER", "SETSLOT", s, "NODE", id)
	m.do(m.From, "CLUSTER", "SETSLOT", s, "NODE", id)
	for _, n := range m.c.Nodes {
		if n != m.To && n != m.From {
			Command(n.addr, "CLUSTER", "SETSLOT", s, "NODE", id) // a replica refuses: it follows its master
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range m.c.Nodes {
		for {
			out, err := Command(n.addr, "CLUSTER", "NODES")
			if err == nil && slotOwner(out, m.Slot) == id {
				break
			}
			if time.Now().After(deadline) {
				m.c.tb.Fatalf("redistest: %s does not say that %s serves slot %d within 30s:\n%s", n.addr, m.To.addr, m.Slot, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (m *Migration) do(n *Server, args ...string) {
	m.c.tb.Helper()
	if out, err := Command(n.addr, args...); err != nil {
		m.c.tb.Fatalf("redistest: %s on %s: %v (%s)", strings.Join(args, " "), n.addr, err, out)
	}
}

// slotOwner returns the ID of the master that CLUSTER NODES's output says
// serves slot, or "".
func slotOwner(nodes string, slot int) string {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, e1 := strconv.Atoi(lo)
			b, e2 := strconv.Atoi(hi)
			if e1 == nil && e2 == nil && a <= slot && slot <= b {
				return f[0]
			}
		}
	}
	return ""
}
