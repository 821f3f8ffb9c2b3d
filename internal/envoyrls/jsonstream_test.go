package envoyrls

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// jsonDescriptors returns a /json body of domain api with n descriptors of
// one entry, the entry written as entry, and then tail before the closing
// brace.
func jsonDescriptors(n int, entry, tail string) string {
	var b strings.Builder
	b.WriteString(`{"domain":"api","descriptors":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"entries":[` + entry + `]}`)
	}
	b.WriteString("]" + tail + "}")
	return b.String()
}

// countingReader reads r and counts the bytes read.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

// postStream sends body to h without a Content-Length (as a chunked body
// comes) and returns the status, the answer and the bytes h read.
func postStream(h http.Handler, body io.Reader) (int, string, int) {
	cr := &countingReader{r: body}
	req := httptest.NewRequest("POST", "/json", cr)
	req.ContentLength = -1
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Code, strings.TrimSpace(w.Body.String()), cr.read
}

// serviceError returns the error the service gives for body, decoded by
// protojson; decoded is false when protojson refuses it.
func serviceError(s *Server, body string) (err error, decoded bool) {
	var in rlsv3.RateLimitRequest
	if protojson.Unmarshal([]byte(body), &in) != nil {
		return nil, false
	}
	_, err = s.decide(context.Background(), &in)
	return err, true
}

// TestJSONBoundsRefusedAsEarlyAsTheBound is the audit's third finding: a
// /json body of 349,509 {} descriptors was read whole (1 MB) and scanned
// before its refusal, 34 ms of rls for each. The check now runs while the
// body is read and stops at the first bound crossed: each bound below is
// followed by 8 MiB that are never read (the reader counts what was), and
// the answer is the service's own 400 message for that field ("or more"
// where the check stopped counting). The same request without the filler
// is refused by the service on the same field.
func TestJSONBoundsRefusedAsEarlyAsTheBound(t *testing.T) {
	s := newServer(t)
	h := s.JSON()
	entry := func(k, v string) string { return `{"key":"` + k + `","value":"` + v + `"}` }
	many := func(n int, item string) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	for _, tc := range []struct {
		name, head, tail string // the body: head, 8 MiB of filler, tail
		want             string
	}{
		{"65 descriptors", `{"domain":"api","descriptors":[` + many(65, `{"entries":[{"key":"k"}]}`) + `,`, `{}]}`,
			"descriptors: 65 descriptors or more, at most 64 allowed"},
		{"the audit's flood: empty descriptors", `{"domain":"api","descriptors":[{}`, `]}`,
			"descriptors[0].entries: must not be empty"},
		{"17 entries", `{"domain":"api","descriptors":[{"entries":[` + many(17, entry("k", "v")) + `,`, `{}]}]}`,
			"descriptors[0].entries: 17 entries or more, at most 16 allowed"},
		{"a key of 257 bytes", `{"domain":"api","descriptors":[{"entries":[{"key":"` + strings.Repeat("k", 257), `"}]}]}`,
			"descriptors[0].entries[0].key: longer than 256 bytes"},
		{"an escaped key of 257 bytes", `{"domain":"api","descriptors":[{"entries":[{"key":"k"}]},{"entries":[{"key":"` + strings.Repeat(`\u00e9`, 128) + `\n`, `"}]}]}`,
			"descriptors[1].entries[0].key: longer than 256 bytes"},
		{"a value of 4097 bytes", `{"domain":"api","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("v", 4097), `"}]}]}`,
			"descriptors[0].entries[0].value: longer than 4096 bytes"},
		{"a domain of 257 bytes", `{"descriptors":[{"entries":[{"key":"k"}]}],"domain":"` + strings.Repeat("d", 257), `"}`,
			"domain: longer than 256 bytes"},
		{"more than 64 KiB of keys and values", `{"domain":"api","descriptors":[{"entries":[` + many(16, entry("k", strings.Repeat("v", 4096))), `]}]}`,
			"descriptors: 65555 bytes of keys and values or more, at most 65536 allowed"},
		{"an empty key", `{"domain":"api","descriptors":[{"entries":[{"key":"","value":"v"}`, `]}]}`,
			"descriptors[0].entries[0].key: must not be empty"},
		{"no entries", `{"domain":"api","descriptors":[{"entries":[]}`, `]}`,
			"descriptors[0].entries: must not be empty"},
	} {
		const filler = 8 << 20
		body := io.MultiReader(strings.NewReader(tc.head), strings.NewReader(strings.Repeat(" ", filler)), strings.NewReader(tc.tail))
		code, out, read := postStream(h, body)
		if code != 400 || out != tc.want {
			t.Errorf("%s: POST /json = %d %q, want 400 %q", tc.name, code, out, tc.want)
		}
		if limit := len(tc.head) + jsonMaxChunk; read > limit {
			t.Errorf("%s: read %d bytes of the body, want at most %d (the bound is crossed within the first %d)", tc.name, read, limit, len(tc.head))
		}
		var inv *service.InvalidError
		err, decoded := serviceError(s, tc.head+tc.tail)
		field, _, _ := strings.Cut(tc.want, ":")
		if decoded && (!errors.As(err, &inv) || inv.Field != field) {
			t.Errorf("%s: the service says %v, want an InvalidError on %s", tc.name, err, field)
		}
	}
	// A body that announces more than the cap is refused before a byte of
	// it is read.
	cr := &countingReader{r: strings.NewReader(strings.Repeat(" ", maxJSONBody+1))}
	req := httptest.NewRequest("POST", "/json", cr)
	req.ContentLength = maxJSONBody + 1
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "too large") || cr.read != 0 {
		t.Errorf("POST /json with Content-Length %d = %d %q having read %d bytes; want 400 naming the bound, nothing read", maxJSONBody+1, w.Code, w.Body.String(), cr.read)
	}
}

// TestJSONAtTheBoundsPasses: requests at every bound pass the check and
// are decided, the longest one too: every bound at its most, pretty-printed
// with proto names, every byte of its strings escaped as \u00XX, which is
// what maxJSONBody is computed from.
func TestJSONAtTheBoundsPasses(t *testing.T) {
	h := newServer(t).JSON()
	entry := func(k, v string) string { return `{"key":"` + k + `","value":"` + v + `"}` }
	many := func(n int, item string) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	// 64 KiB of domain, keys and values: 3 + 15 × (1 + 4096) + 1 + 4017.
	total := `{"domain":"api","descriptors":[{"entries":[` + many(15, entry("k", strings.Repeat("v", 4096))) + `,` + entry("k", strings.Repeat("v", 65536-3-15*4097-1)) + `]}]}`
	for _, tc := range []struct{ name, body string }{
		{"64 descriptors", jsonDescriptors(64, entry("remote_address", "10.0.0.1"), "")},
		{"16 entries", `{"domain":"api","descriptors":[{"entries":[` + many(16, entry("k", "v")) + `]}]}`},
		{"a key of 256 bytes, a value of 4096", `{"domain":"api","descriptors":[{"entries":[` + entry(strings.Repeat("k", 256), strings.Repeat("v", 4096)) + `]}]}`},
		{"escaped to 256 bytes", `{"domain":"api","descriptors":[{"entries":[` + entry(strings.Repeat(`\u00e9`, 126)+`\ud83d\ude00`, "v") + `]}]}`},
		{"a domain of 256 bytes", `{"domain":"` + strings.Repeat("d", 256) + `","descriptors":[{"entries":[{"key":"k"}]}]}`},
		{"64 KiB of keys and values", total},
		{"the longest request", string(longestRequest(t))},
	} {
		if code, out, _ := postStream(h, strings.NewReader(tc.body)); code != 200 && code != 429 {
			t.Errorf("%s (%d bytes): POST /json = %d %.200q, want it decided", tc.name, len(tc.body), code, out)
		}
	}
}

// longestRequest is a RateLimitRequest with every bound at its most (64
// descriptors of 16 entries, 64 KiB of strings made of a control byte,
// which JSON escapes in 6 bytes; every optional field at its longest),
// marshaled by protojson pretty-printed four spaces deep with proto names:
// no real request's JSON is longer. It must fit maxJSONBody.
func longestRequest(t *testing.T) []byte {
	t.Helper()
	str := func(n int) string { return strings.Repeat("\x01", n) }
	in := &rlsv3.RateLimitRequest{Domain: str(256), HitsAddend: 1<<32 - 1}
	left := service.MaxRequestBytes - 256
	per := left / (service.MaxDescriptors * service.MaxEntries) // bytes per entry
	for range service.MaxDescriptors {
		d := &commonv3.RateLimitDescriptor{
			Limit:          &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1<<32 - 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(100 * 365 * 24 * 3600)},
			HitsAddend:     wrapperspb.UInt64(service.MaxHits),
			IsNegativeHits: true,
		}
		for range service.MaxEntries {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: str(per / 2), Value: str(per - per/2)})
		}
		in.Descriptors = append(in.Descriptors, d)
	}
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "    ", UseProtoNames: true}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxJSONBody {
		t.Fatalf("the longest request takes %d bytes of JSON, more than maxJSONBody (%d)", len(b), maxJSONBody)
	}
	t.Logf("the longest request: %d bytes of JSON (maxJSONBody %d)", len(b), maxJSONBody)
	return b
}

// TestJSONRefusalClosesTheConnection: a body refused before its end is not
// read any further, nor drained by net/http (which reads up to 256 KiB of
// an unread body to keep the connection): the answer comes, and the
// connection closes while the client is still sending. The listener
// counts what the server read from the connection.
func TestJSONRefusalClosesTheConnection(t *testing.T) {
	l := &countingListener{Listener: servetest.Listen(t)}
	srv := &http.Server{Handler: newServer(t).JSON(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() { srv.Close(); <-done })

	head := `{"domain":"api","descriptors":[` + strings.Repeat(`{},`, 65)
	spaces := strings.Repeat(" ", 1<<16)
	for _, tc := range []struct {
		name, headers string
		body          func(w io.Writer) error // what the client sends after the headers
		endless       bool                    // more than the socket buffers hold: the client's writes must fail
	}{
		{"chunked", "Transfer-Encoding: chunked\r\n", func(w io.Writer) error {
			if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(head), head); err != nil {
				return err
			}
			for range 1 << 10 { // 64 MiB
				if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(spaces), spaces); err != nil {
					return err
				}
			}
			return nil
		}, true},
		{"Content-Length within net/http's drain", fmt.Sprintf("Content-Length: %d\r\n", 200<<10), func(w io.Writer) error {
			_, err := io.WriteString(w, head+strings.Repeat(" ", 200<<10-len(head)))
			return err
		}, false},
		{"Content-Length over the cap", fmt.Sprintf("Content-Length: %d\r\n", 64<<20), func(w io.Writer) error {
			for range 1 << 10 {
				if _, err := io.WriteString(w, spaces); err != nil {
					return err
				}
			}
			return nil
		}, true},
	} {
		l.read.Store(0)
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		headers := fmt.Sprintf("POST /json HTTP/1.1\r\nHost: rls\r\nContent-Type: application/json\r\n%s\r\n", tc.headers)
		io.WriteString(c, headers)
		sent := make(chan error, 1)
		go func() { sent <- tc.body(c) }()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", tc.name, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !resp.Close {
			t.Errorf("%s: %s %q (Connection: %q), want 400 closing the connection", tc.name, resp.Status, answer, resp.Header.Get("Connection"))
		}
		// The server closes: the client's reads end, and its writes fail.
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
			t.Errorf("%s: the connection is still open after the answer (read %d, %v)", tc.name, n, err)
		}
		if err := <-sent; tc.endless && (err == nil || os.IsTimeout(err)) {
			t.Errorf("%s: the client's writes ended with %v, want the connection closed under them", tc.name, err)
		}
		c.Close()
		if n, limit := l.read.Load(), int64(len(headers)+len(head)+jsonMaxChunk+8<<10); n > limit {
			t.Errorf("%s: the server read %d bytes from the connection, want at most %d", tc.name, n, limit)
		}
	}
}

// countingListener counts the bytes read from the connections it accepts.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, read: &l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// FuzzJSONStream keeps the streaming check and the decoder in agreement:
// whatever the check refuses for a bound, protojson or the service refuses
// too; what it lets through and protojson decodes, the service refuses for
// none of the bounds the check applies (only for what it leaves to the
// service: hits, overrides); and how the body arrives (at once, a byte at
// a time, halves) changes nothing.
func FuzzJSONStream(f *testing.F) {
	s := newServer(f)
	f.Add(jsonDescriptors(2, `{"key":"k","value":"v"}`, ""))
	f.Add(jsonDescriptors(65, `{}`, ""))
	f.Add(jsonDescriptors(1, `{"key":"k\u00e9\ud83d\ude00","value":"\u0000"}`, `,"hitsAddend":3`))
	f.Add(`{"domain":null,"descriptors":null}`)
	f.Add(`{"descriptors":[{"entries":[{},{}]}],"domain":"a\"b"}`)
	f.Add(`{"domain":"api","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":5,"unit":"SECOND"},"hitsAddend":"7"}]}`)
	f.Add(`{"d\u006fmain":"api","descriptors":[{"entries":[{"value":"v","key":"` + strings.Repeat("k", 256) + `"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > maxJSONBody {
			return
		}
		_, err := readJSONRequest(strings.NewReader(body), maxJSONBody, 0)
		for _, r := range []io.Reader{iotest.OneByteReader(strings.NewReader(body)), iotest.HalfReader(strings.NewReader(body))} {
			if _, err2 := readJSONRequest(r, maxJSONBody, 0); fmt.Sprint(err2) != fmt.Sprint(err) {
				t.Fatalf("%q: read at once: %v; in small reads: %v", body, err, err2)
			}
		}
		var in rlsv3.RateLimitRequest
		decoded := protojson.Unmarshal([]byte(body), &in) == nil
		var serr error
		if decoded {
			_, serr = s.decide(context.Background(), &in)
		}
		var inv *service.InvalidError
		if err != nil {
			if decoded && !errors.As(serr, &inv) {
				t.Fatalf("the check refused %q (%v); protojson and the service accept it", body, err)
			}
			return
		}
		if errors.As(serr, &inv) && !strings.HasSuffix(inv.Field, "hits_addend") && !strings.Contains(inv.Field, ".limit.") {
			t.Fatalf("the check let %q through; the service refuses it: %v", body, serr)
		}
	})
}

// TestJSONStreamAgreesWithTheDecoder is FuzzJSONStream's property on
// seeded random requests built near every bound: counts of descriptors
// and entries around their maxima, strings around their longest with
// escapes of every length (\u00e9, surrogate pairs, raw UTF-8), nulls,
// absent and repeated fields, hits and overrides in and out of range,
// random blanks, and one body in eight cut or corrupted at a random byte.
func TestJSONStreamAgreesWithTheDecoder(t *testing.T) {
	s := newServer(t)
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	refused := 0
	for n := range 2000 {
		body := randomJSONRequest(rng)
		_, err := readJSONRequest(strings.NewReader(body), maxJSONBody, 0)
		small := iotest.HalfReader(strings.NewReader(body))
		if len(body) < 8<<10 {
			small = iotest.OneByteReader(strings.NewReader(body))
		}
		if _, err2 := readJSONRequest(small, maxJSONBody, 0); fmt.Sprint(err2) != fmt.Sprint(err) {
			t.Fatalf("seed %d, body %d: read at once: %v; in small reads: %v", seed, n, err, err2)
		}
		serr, decoded := serviceError(s, body)
		var inv *service.InvalidError
		switch {
		case err != nil:
			refused++
			if decoded && !errors.As(serr, &inv) {
				t.Fatalf("seed %d, body %d: the check refused %.300q (%v); protojson and the service accept it", seed, n, body, err)
			}
		case errors.As(serr, &inv) && !strings.HasSuffix(inv.Field, "hits_addend") && !strings.Contains(inv.Field, ".limit."):
			t.Fatalf("seed %d, body %d: the check let %.300q through; the service refuses it: %v", seed, n, body, serr)
		}
	}
	t.Logf("seed %d: the check refused %d of 2000 bodies", seed, refused)
}

// randomJSONRequest returns the JSON text of a random RateLimitRequest
// near the service's bounds (see TestJSONStreamAgreesWithTheDecoder).
func randomJSONRequest(rng *rand.Rand) string {
	var b strings.Builder
	blank := func() {
		if rng.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n  ", "\t", "\r\n"}[rng.IntN(4)])
		}
	}
	count := func(most int) int { // around 0, 1, 2 or the most
		switch rng.IntN(5) {
		case 0:
			return rng.IntN(3)
		case 1:
			return most - 1 + rng.IntN(3)
		}
		return 1 + rng.IntN(3)
	}
	length := func(most int) int {
		switch rng.IntN(8) {
		case 0:
			return 0
		case 1:
			return most - 3 + rng.IntN(5)
		}
		return 1 + rng.IntN(12)
	}
	// str writes a JSON string whose value is about n bytes long.
	str := func(n int) {
		if rng.IntN(30) == 0 {
			b.WriteString("null")
			return
		}
		b.WriteByte('"')
		for m := 0; m < n; {
			switch k := rng.IntN(12); {
			case k == 0 && n-m >= 2:
				b.WriteString(`\u00e9`)
				m += 2
			case k == 1 && n-m >= 4:
				b.WriteString(`\ud83d\ude00`)
				m += 4
			case k == 2 && n-m >= 3:
				b.WriteString("€")
				m += 3
			case k == 3:
				b.WriteString([]string{`\n`, `\"`, `\\`, `\/`, `\u0000`, `\t`}[rng.IntN(6)])
				m++
			default:
				run := min(n-m, 1+rng.IntN(64))
				b.WriteString(strings.Repeat(string("abcxyz_-./:"[rng.IntN(11)]), run))
				m += run
			}
		}
		b.WriteByte('"')
	}
	member := func(first *bool, name string) {
		if !*first {
			b.WriteByte(',')
		}
		*first = false
		blank()
		b.WriteString(`"` + name + `":`)
		blank()
	}
	b.WriteByte('{')
	top := true
	if rng.IntN(10) != 0 {
		member(&top, []string{"domain", `d\u006fmain`}[rng.IntN(2)])
		str(length(service.MaxDomainLen))
	}
	if rng.IntN(20) != 0 {
		member(&top, "descriptors")
		nd := count(service.MaxDescriptors)
		b.WriteByte('[')
		for i := range nd {
			if i > 0 {
				b.WriteByte(',')
			}
			blank()
			d := true
			b.WriteByte('{')
			if rng.IntN(15) != 0 {
				member(&d, "entries")
				b.WriteByte('[')
				for j := range count(service.MaxEntries) {
					if j > 0 {
						b.WriteByte(',')
					}
					e := true
					b.WriteByte('{')
					if rng.IntN(15) != 0 {
						member(&e, "key")
						str(length(service.MaxKeyLen))
					}
					if rng.IntN(3) != 0 {
						member(&e, "value")
						str(length(service.MaxValueLen))
					}
					if rng.IntN(40) == 0 {
						member(&e, "key") // a repeated field
						str(1)
					}
					b.WriteByte('}')
				}
				b.WriteByte(']')
			}
			if rng.IntN(6) == 0 {
				member(&d, []string{"hitsAddend", "hits_addend"}[rng.IntN(2)])
				fmt.Fprintf(&b, `"%d"`, []uint64{0, 1, service.MaxHits, service.MaxHits + 1}[rng.IntN(4)])
			}
			if rng.IntN(6) == 0 {
				member(&d, "limit")
				b.WriteString([]string{`{"requestsPerUnit":5,"unit":"MINUTE"}`, `{"requestsPerUnit":5}`, `{"unit":"YEAR","unitMultiplier":101}`, `null`}[rng.IntN(4)])
			}
			if rng.IntN(10) == 0 {
				member(&d, "isNegativeHits")
				b.WriteString("true")
			}
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	if rng.IntN(8) == 0 {
		member(&top, "hitsAddend")
		b.WriteString([]string{"1", "4294967295", "1e2", `"7"`}[rng.IntN(4)])
	}
	blank()
	b.WriteByte('}')
	out := b.String()
	if rng.IntN(8) == 0 && len(out) > 0 { // cut, or a byte changed
		i := rng.IntN(len(out))
		if rng.IntN(2) == 0 {
			return out[:i]
		}
		return out[:i] + string("{}[]\",:\\n0 \x01"[rng.IntN(12)]) + out[i+1:]
	}
	return out
}

// BenchmarkJSON is POST /json of a request of two descriptors, decided.
func BenchmarkJSON(b *testing.B) {
	h := newServer(b).JSON()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.2.3"}]},{"entries":[{"key":"tenant","value":"t1"}],"hitsAddend":"0"}]}`
	b.ReportAllocs()
	for b.Loop() {
		if code, out := postJSON(h, strings.NewReader(body)); code != 200 && code != 429 {
			b.Fatalf("POST /json = %d %s", code, out)
		}
	}
}

// BenchmarkJSONFlood is the audit's hostile body, 1 MB of empty
// descriptors without a Content-Length, refused.
func BenchmarkJSONFlood(b *testing.B) {
	h := newServer(b).JSON()
	body := jsonDescriptors(0, "", "")
	body = body[:len(body)-2] + strings.TrimSuffix(strings.Repeat("{},", 349509), ",") + "]}"
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if code, out, _ := postStream(h, strings.NewReader(body)); code != 400 {
			b.Fatalf("POST /json = %d %s", code, out)
		}
	}
}

// BenchmarkJSONLongest is the costliest body the check reads whole: a
// valid request, then an unknown field whose string fills the cap
// (protojson then refuses the field).
func BenchmarkJSONLongest(b *testing.B) {
	h := newServer(b).JSON()
	head := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.9"}]}],"x":"`
	body := head + strings.Repeat("a", maxJSONBody-len(head)-2) + `"}`
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if code, out := postJSON(h, strings.NewReader(body)); code != 400 {
			b.Fatalf("POST /json = %d %s", code, out)
		}
	}
}

// TestPlainRun: plainRun stops at the first quote, backslash or control
// character, wherever it is in a word of eight, for every byte value.
func TestPlainRun(t *testing.T) {
	for c := range 256 {
		for at := range 20 {
			b := bytes.Repeat([]byte("a"), 20)
			b[at] = byte(c)
			want := 20
			if c < 0x20 || c == '"' || c == '\\' {
				want = at
			}
			if got := plainRun(b); got != want {
				t.Fatalf("plainRun(%q) = %d, want %d", b, got, want)
			}
		}
	}
}

// TestJSONBufferGrowsWithWhatComes: a body that announces the cap holds
// memory in proportion to the bytes that came (a first chunk, four times
// as much under 64 KiB, then the announced size), not to its announcement:
// connections that announce 500 KB and stall cost 4 KiB each.
func TestJSONBufferGrowsWithWhatComes(t *testing.T) {
	r := &countingReader{r: strings.NewReader(strings.Repeat(" ", maxJSONBody))}
	s := jsonStream{r: r, max: maxJSONBody, size: maxJSONBody + 1, chunk: jsonReadChunk}
	for _, step := range []struct{ read, most int }{
		{100, jsonReadChunk}, {jsonReadChunk, 4 * jsonReadChunk}, {20 << 10, 16 * jsonReadChunk}, {70 << 10, maxJSONBody + 1},
	} {
		r.r = io.LimitReader(strings.NewReader(strings.Repeat(" ", maxJSONBody)), int64(step.read-len(s.buf)))
		for len(s.buf) < step.read && s.more() {
		}
		if len(s.buf) != step.read || cap(s.buf) > step.most {
			t.Errorf("after %d bytes: %d read, a buffer of %d bytes, want at most %d", step.read, len(s.buf), cap(s.buf), step.most)
		}
	}
}
