//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package redisstore

import (
	"net"
	"syscall"
)

// connAlive reports whether c, a connection idle between two pipelines,
// can carry the next one: open, the peer has not closed it, and nothing
// unasked waits to be read (an error the server sent before closing, or
// stray bytes that would be taken for the next reply). It looks at the
// socket under any TLS layer without reading from it. A connection whose
// socket it cannot reach is taken as alive.
func connAlive(c net.Conn) bool {
	for range 8 {
		if sc, ok := c.(syscall.Conn); ok {
			return socketAlive(sc)
		}
		inner, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return true
		}
		c = inner.NetConn()
	}
	return true
}

func socketAlive(sc syscall.Conn) bool {
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	// Control, not Read: Read fails once the read deadline that go-redis
	// left on the connection has passed, and MSG_DONTWAIT does not block.
	alive := false
	err = raw.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Only "nothing to read yet" is open and idle: a read of 0 bytes is
		// the peer's close, of 1 byte is bytes nobody asked for, an error
		// a broken connection.
		alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
	})
	return err == nil && alive
}
