package clientip

import (
	"net/netip"
	"testing"
)

func TestFromForwarded(t *testing.T) {
	trusted := Trusted{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"203.0.113.9", []string{"1.2.3.4"}, "203.0.113.9"},              // untrusted peer: XFF ignored
		{"10.0.0.2", nil, "10.0.0.2"},                                    // trusted peer, no XFF
		{"10.0.0.2", []string{"1.2.3.4"}, "1.2.3.4"},                     // one hop
		{"10.0.0.2", []string{"6.6.6.6, 1.2.3.4, 10.0.0.7"}, "1.2.3.4"},  // spoofed left part skipped
		{"10.0.0.2", []string{"6.6.6.6", "1.2.3.4,10.0.0.7"}, "1.2.3.4"}, // several header lines
		{"10.0.0.2", []string{"10.1.1.1, 10.0.0.7"}, "10.1.1.1"},         // all trusted: the left-most
		{"10.0.0.2", []string{"garbage, 10.0.0.7"}, "10.0.0.7"},          // unparsable hop: stop there
		{"::1", []string{"[2001:db8::1]:443"}, "2001:db8::1"},            // bracketed with port
		{"10.0.0.2", []string{"::ffff:192.0.2.1"}, "192.0.2.1"},          // mapped IPv4
	} {
		got := trusted.FromForwarded(netip.MustParseAddr(tc.peer), tc.xff)
		if got.String() != tc.want {
			t.Errorf("FromForwarded(peer %s, %q) = %s, want %s", tc.peer, tc.xff, got, tc.want)
		}
	}
	if got := Trusted(nil).FromForwarded(netip.MustParseAddr("10.0.0.2"), []string{"1.2.3.4"}); got.String() != "10.0.0.2" {
		t.Errorf("no trusted proxies: FromForwarded = %s, want the peer", got)
	}
}

func FuzzFromForwarded(f *testing.F) {
	f.Add("1.2.3.4, 10.0.0.1", "10.0.0.2")
	f.Add(",,,", "::1")
	trusted := Trusted{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	f.Fuzz(func(t *testing.T, xff, peer string) {
		p, _ := Parse(peer)
		got := trusted.FromForwarded(p, []string{xff})
		if got != p && !got.IsValid() {
			t.Fatalf("FromForwarded(%q, %q) = invalid address", peer, xff)
		}
	})
}
