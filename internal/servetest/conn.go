package servetest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// ReadBound bounds ClosedByServer's and GetKeepAlive's waits for the
// server: a behavioural bound (the server answers, or closes, at all), far
// above the limits that make a server close a connection.
const ReadBound = 10 * time.Second

// ClosedByServer reports whether the server closed c (a read ends with EOF
// or a reset) within ReadBound, after reading what it still had to send.
func ClosedByServer(t testing.TB, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(ReadBound))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// GetKeepAlive sends GET path over HTTP/1.1 on c and reads the answer,
// leaving the connection open.
func GetKeepAlive(t testing.TB, c net.Conn, path string) {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(ReadBound))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetReadDeadline(time.Time{})
}
