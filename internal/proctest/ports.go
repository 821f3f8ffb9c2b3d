package proctest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
)

// Ports that FreePort hands out are drawn from below the kernel's ephemeral
// range (ip_local_port_range: 32768 and up by default), where the kernel
// puts neither the local port of a connection nor a listener on port 0. A
// port drawn with port 0 was free a moment ago but could be the kernel's
// next pick for any process, and tests running beside this one made that
// happen (rls failing with "address already in use"). Here only another
// test drawing the same port at the same moment can take it, and
// StartListening retries then. A Redis Cluster node's bus port (port +
// 10000) stays below the range too.
const (
	firstPort = 10000
	endPorts  = 22768
)

// FreePort returns a loopback TCP port that was free a moment ago, for a
// server (another process, often) that must be given its port up front.
func FreePort() (int, error) {
	for range 100 {
		p := firstPort + rand.IntN(endPorts-firstPort)
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			l.Close()
			return p, nil
		}
	}
	// The range is crowded: the kernel's pick.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr is FreePort as an address, "127.0.0.1:port".
func FreeAddr() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// FreeAddrs is n FreeAddrs, for a program that serves on several.
func FreeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// Port is FreePort for a test, which fails when there is none.
func Port(tb testing.TB) int {
	tb.Helper()
	p, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// Addr is FreeAddr for a test, which fails when there is none.
func Addr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(tb)))
}

// addressInUse reports whether a server's output says that it could not
// listen because the port was taken (redis-server and nginx write
// "Address already in use", Go programs "address already in use").
func addressInUse(output string) bool {
	return strings.Contains(strings.ToLower(output), "address already in use")
}

// StartListening starts a server that must be told its address up front:
// it draws a free loopback address, starts argv(addr) and waits until
// ready(addr) holds. A port drawn free can be taken before the server binds
// it; when the server's output says so, it tries again with another
// address, three times in all. It fails the test on any other failure, with
// the server's output. The failed attempts are stopped at once.
func StartListening(tb testing.TB, o Options, argv func(addr string) []string, ready func(addr string) func() bool) (*Proc, string) {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		addr := Addr(tb)
		p := Start(tb, o, argv(addr)...)
		err := p.WaitFor(ready(addr))
		if err == nil {
			return p, addr
		}
		p.Stop()
		if attempt < 3 && addressInUse(p.Output()) {
			continue
		}
		tb.Fatalf("%s on %s: %v\n%s", p.Name(), addr, err, p.Output())
	}
}
