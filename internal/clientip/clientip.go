// Package clientip finds the original client's address of a request that
// came through proxies, from the peer address and X-Forwarded-For, believing
// only the proxies an operator trusts. It knows nothing else about requests.
package clientip

import (
	"net/netip"
	"strings"
)

// Parse parses an IP address, with or without a port or brackets; IPv4
// mapped IPv6 addresses are unmapped.
func Parse(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// Trusted is a set of proxy networks. The zero value trusts nobody.
type Trusted []netip.Prefix

// Contains reports whether a is in the set.
func (t Trusted) Contains(a netip.Addr) bool {
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// FromForwarded returns the client of a request received from peer with the
// X-Forwarded-For header values xff: when peer is a trusted proxy, the
// right-most hop that is not a trusted proxy (the left-most when all are);
// otherwise peer itself, so that a client cannot choose its own address.
func (t Trusted) FromForwarded(peer netip.Addr, xff []string) netip.Addr {
	if !t.Contains(peer) {
		return peer
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := xff[i]
		for hops != "" {
			j := strings.LastIndexByte(hops, ',')
			hop := hops[j+1:]
			if j < 0 {
				hops = ""
			} else {
				hops = hops[:j]
			}
			a, ok := Parse(hop)
			if !ok {
				return client // a hop that is not an address: stop believing
			}
			client = a
			if !t.Contains(a) {
				return a
			}
		}
	}
	return client
}
