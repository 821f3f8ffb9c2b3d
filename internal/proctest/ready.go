package proctest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The probes below are conditions for WaitFor: each tries once, briefly,
// and reports whether the server is there yet.

// Listening reports whether addr accepts TCP connections.
func Listening(addr string) func() bool {
	return func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
}

// get is a GET with a short timeout that keeps no connection for later (a
// server stopped afterwards sees no idle client).
func get(url string) (*http.Response, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	return c.Get(url)
}

// HTTPOK reports whether a GET of url answers 200 (rls's /readyz and
// /healthz, Prometheus's /-/ready).
func HTTPOK(url string) func() bool {
	return func() bool {
		resp, err := get(url)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// RedisPONG reports whether a Redis server without password or TLS on addr
// answers PING (sent in Redis's inline protocol) with PONG.
func RedisPONG(addr string) func() bool {
	return func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return false
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && line == "+PONG\r\n"
	}
}

// Samples reads the samples without labels of a Prometheus text page
// (rls's /metrics): name → value.
func Samples(url string) (map[string]float64, error) {
	resp, err := get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return out, nil
}
