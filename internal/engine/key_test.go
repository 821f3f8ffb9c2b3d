package engine

import (
	"strings"
	"testing"
)

func key(domain string, shares []string, kv ...string) string {
	var entries []Entry
	for i := 0; i < len(kv); i += 2 {
		entries = append(entries, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return string(AppendDescriptorKey(nil, domain, entries, shares))
}

func TestDescriptorKey(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{key("api", nil, "remote_address", "10.0.0.1"), "api/remote_address=10.0.0.1"},
		{key("api", nil, "path", "/v1/{x}:y", "m", "a=b"), "api/path=%2Fv1%2F%7Bx%7D%3Ay/m=a%3Db"},
		{key("d", nil, "k", "a b%\x00é"), "d/k=a%20b%25%00%C3%A9"},
		{key("d", nil, "k", ""), "d/k="},
	} {
		if tc.got != tc.want {
			t.Errorf("key = %q, want %q", tc.got, tc.want)
		}
	}
}

// Regression test for the reference's counter collisions: it joins with "_",
// so ("a_b", "c") and ("a", "b_c") share a counter there.
func TestDescriptorKeyNoCollisions(t *testing.T) {
	pairs := [][2]string{
		{key("d", nil, "a_b", "c"), key("d", nil, "a", "b_c")},
		{key("d", nil, "a/b", "c"), key("d", nil, "a", "b/c")},
		{key("d", nil, "a=b", "c"), key("d", nil, "a", "b=c")},
		{key("d", nil, "a", "b", "c", "d"), key("d", nil, "a", "b/c=d")},
		{key("d/a", nil, "b", "c"), key("d", nil, "a", "", "b", "c")},
		{key("d", nil, "k", "%2F"), key("d", nil, "k", "/")},
		{key("d", nil, "k", strings.Repeat("x", 100)), key("d", nil, "k", strings.Repeat("x", 101))},
	}
	for _, p := range pairs {
		if p[0] == p[1] {
			t.Errorf("two different descriptors share the key %q", p[0])
		}
	}
}

func TestDescriptorKeyBoundedAndTagSafe(t *testing.T) {
	long := strings.Repeat("{}é", 10_000)
	k := key("d", nil, "k", long, long, "v")
	if len(k) > 2+3*23 {
		t.Errorf("key of a 60 kB descriptor is %d bytes, want it bounded: %q", len(k), k)
	}
	if strings.ContainsAny(k, "{}") {
		t.Errorf("key %q contains a brace: it would break the Redis hash tag", k)
	}
	if k2 := key("d", nil, "k", long+"x", long, "v"); k2 == k {
		t.Errorf("hashed values %q collide", k)
	}
}

func TestDescriptorKeyShareThreshold(t *testing.T) {
	shares := []string{"/api/*", ""}
	a := key("d", shares, "path", "/api/a", "method", "GET")
	b := key("d", shares, "path", "/api/b", "method", "GET")
	if a != b || a != "d/path~%2Fapi%2F*/method=GET" {
		t.Errorf("share_threshold keys = %q and %q, want both %q", a, b, "d/path~%2Fapi%2F*/method=GET")
	}
	if c := key("d", nil, "path", "/api/a", "method", "GET"); c == a {
		t.Errorf("a descriptor without shares (an override) used the shared key %q", c)
	}
}

func BenchmarkDescriptorKey(b *testing.B) {
	entries := []Entry{{Key: "remote_address", Value: "192.168.10.23"}, {Key: "path", Value: "/api/v1/users"}}
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendDescriptorKey(buf[:0], "api", entries, nil)
	}
}
