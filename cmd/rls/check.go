package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The exit codes of rls check besides 0 (every answer OK) and 2 (a bad
// command line).
const (
	checkOverLimit = 1 // an answer was OVER_LIMIT
	checkFailed    = 3 // a request failed: no connection, refused, timed out
)

// checkFlags are rls check's flags.
type checkFlags struct {
	addr    string
	n       int
	hits    uint
	timeout time.Duration
	tls     tlsClientFlags
}

func newCheckFlagSet() (*flag.FlagSet, *checkFlags) {
	fs := flag.NewFlagSet("rls check", flag.ContinueOnError)
	f := &checkFlags{}
	fs.StringVar(&f.addr, "addr", "localhost:8081", "rls's gRPC `address`")
	fs.IntVar(&f.n, "n", 1, "`requests` to send, one after the other over one connection")
	fs.UintVar(&f.hits, "hits", 0, "the `hits` of each request (hits_addend; 0 counts as 1)")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "bound on each request")
	f.tls.define(fs)
	return fs, f
}

func checkDetails(w io.Writer) {
	fmt.Fprint(w, `Sends the RateLimitRequest of DOMAIN with one descriptor per DESCRIPTOR argument, written
key=value[,key=value...], as Envoy would (a value cannot hold a comma here), and prints one
line per answer: its number, the overall code, then per descriptor its code, the binding limit,
what remains and the seconds until reset. Exit status: 0 when every answer is OK, 1 when one is
OVER_LIMIT, 3 when a request fails (no connection, InvalidArgument, timeout), 2 for a bad
command line.

  rls check -n 11 api remote_address=203.0.113.7

flags:
`)
	fs, _ := newCheckFlagSet()
	printFlags(w, fs, nil, false)
}

// check sends RateLimitRequests to a running rls and prints the answers.
func check(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newCheckFlagSet()
	if err := commandFlags("check", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	req, err := f.request(fs.Args())
	if err != nil {
		return usageError{fmt.Errorf("check: %w (rls check --help)", err)}
	}
	creds, err := f.credentials()
	if err != nil {
		return usageError{fmt.Errorf("check: %w", err)}
	}
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return usageError{fmt.Errorf("check: --addr: %w", err)}
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	over := false
	for i := 1; i <= f.n; i++ {
		rctx, cancel := context.WithTimeout(ctx, f.timeout)
		resp, err := client.ShouldRateLimit(rctx, req)
		cancel()
		if err != nil {
			return exitError{checkFailed, fmt.Errorf("check: request %d: %w", i, err)}
		}
		fmt.Fprintln(stdout, answerLine(i, resp))
		over = over || resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if over {
		return exitError{checkOverLimit, errSilent}
	}
	return nil
}

// request builds the request of the arguments DOMAIN DESCRIPTOR...
func (f *checkFlags) request(args []string) (*rlsv3.RateLimitRequest, error) {
	if len(args) < 2 {
		return nil, errors.New("want DOMAIN and at least one DESCRIPTOR")
	}
	if f.n < 1 {
		return nil, fmt.Errorf("-n %d: at least 1", f.n)
	}
	if f.hits > 1<<32-1 {
		return nil, fmt.Errorf("--hits %d: more than hits_addend holds", f.hits)
	}
	req := &rlsv3.RateLimitRequest{Domain: args[0], HitsAddend: uint32(f.hits)}
	for _, arg := range args[1:] {
		d := &commonv3.RateLimitDescriptor{}
		for _, kv := range strings.Split(arg, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("descriptor %q: entries are key=value, separated by commas", arg)
			}
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, nil
}

// credentials returns plaintext, or TLS when a TLS flag is set.
func (f *checkFlags) credentials() (credentials.TransportCredentials, error) {
	if !f.tls.on() {
		return insecure.NewCredentials(), nil
	}
	cfg, err := f.tls.config()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// answerLine is one answer as rls check prints it, e.g.
//
//	11 OVER_LIMIT: OVER_LIMIT 10/second remaining=0 reset=1s
func answerLine(i int, resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s:", i, resp.GetOverallCode())
	for j, st := range resp.GetStatuses() {
		if j > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s", st.GetCode())
		l := st.GetCurrentLimit()
		if l == nil {
			if st.GetLimitRemaining() == 1<<32-1 {
				b.WriteString(" unlimited")
			} else {
				b.WriteString(" no limit")
			}
			continue
		}
		fmt.Fprintf(&b, " %d/", l.GetRequestsPerUnit())
		if m := l.GetUnitMultiplier().GetValue(); m > 1 {
			fmt.Fprintf(&b, "%d", m)
		}
		b.WriteString(strings.ToLower(l.GetUnit().String()))
		if l.GetName() != "" {
			fmt.Fprintf(&b, " %q", l.GetName())
		}
		fmt.Fprintf(&b, " remaining=%d reset=%ds", st.GetLimitRemaining(), st.GetDurationUntilReset().GetSeconds())
	}
	return b.String()
}
