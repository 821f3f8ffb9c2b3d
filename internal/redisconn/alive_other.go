//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package redisconn

import (
	"net"
	"syscall"
)

// socketOf cannot look at a socket on this system.
func socketOf(net.Conn) syscall.RawConn { return nil }

// socketAlive takes every connection as alive on this system: one that the
// server closed fails the pipeline sent on it, and the link is set up again
// before the next.
func socketAlive(syscall.RawConn) bool { return true }

// socketReadable cannot look at a socket on this system: it reports that
// nothing waits.
func socketReadable(syscall.RawConn) bool { return false }
