//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package redisconn

import (
	"net"
	"syscall"
)

// socketOf returns the socket under c and any TLS layer, or nil when there
// is none to look at.
func socketOf(c net.Conn) syscall.RawConn {
	for range 8 {
		if sc, ok := c.(syscall.Conn); ok {
			raw, err := sc.SyscallConn()
			if err != nil {
				return nil
			}
			return raw
		}
		inner, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = inner.NetConn()
	}
	return nil
}

// socketAlive reports whether a connection idle between two pipelines,
// whose socket is raw (socketOf), can carry the next one: open, the peer
// has not closed it, and nothing unasked waits to be read (an error the
// server sent before closing, or stray bytes that would be taken for the
// next reply). It does not read from the socket. A connection without a
// socket to look at (raw nil) is taken as alive.
func socketAlive(raw syscall.RawConn) bool {
	if raw == nil {
		return true
	}
	// Control, not Read: Read fails once the read deadline that go-redis
	// left on the connection has passed, and MSG_DONTWAIT does not block.
	alive := false
	err := raw.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Only "nothing to read yet" is open and idle: a read of 0 bytes is
		// the peer's close, of 1 byte is bytes nobody asked for, an error
		// a broken connection.
		alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
	})
	return err == nil && alive
}

// socketReadable reports whether bytes wait to be read on the raw socket
// (socketOf): a reply that arrived and that nobody has read yet. It does
// not read them.
func socketReadable(raw syscall.RawConn) bool {
	if raw == nil {
		return false
	}
	readable := false
	err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		readable = err == nil && n == 1
	})
	return err == nil && readable
}
