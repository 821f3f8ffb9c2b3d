package redisconn

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestReplyWaitingKeepsTheCallWaiting: a pipeline's wait timer does not
// answer "no reply" while bytes of the replies wait, unread, on its
// connection (the audit's saturation errors: rls itself waited for a core
// and read the replies after the wait had ended); with nothing waiting it
// answers once the wait is over.
func TestReplyWaitingKeepsTheCallWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	socket := socketOf(conn)

	const span = 20 * time.Millisecond
	wait := func() (*call, *replyWait) {
		c := &call{ctx: context.Background(), done: make(chan struct{})}
		c.state.Store(pending | 1<<statusBits)
		w := &replyWait{socket: socket, span: span, bound: time.Minute, calls: []timedCall{{c, 1}}}
		w.start(time.Now())
		return c, w
	}

	// Nothing to read: answered once the wait is over.
	c, w := wait()
	select {
	case <-c.done:
		if !errors.Is(c.err, errNoReply) {
			t.Errorf("with no reply waiting: answered %v, want errNoReply", c.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("with no reply waiting: not answered within 10 s of a 20 ms wait")
	}
	w.stop()

	// A reply waits on the connection: the call waits for the worker to
	// read it, five spans and more.
	if _, err := peer.Write([]byte("+OK\r\n")); err != nil {
		t.Fatal(err)
	}
	for !socketReadable(socket) {
		time.Sleep(time.Millisecond) // the bytes cross loopback
	}
	c, w = wait()
	time.Sleep(5 * span)
	w.stop()
	if c.status() != pending {
		t.Errorf("with a reply waiting unread: answered %v after five spans, want the call still waiting", c.err)
	}
}
