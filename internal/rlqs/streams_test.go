package rlqs

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/rlsproject/rls/internal/engine/storetest"
)

// TestStreamsListed: Streams lists each stream served, from its start,
// with its peer, the domain of its first report and its buckets with the
// action sent and the limits sizing them, and no longer once it ends.
func TestStreamsListed(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	srv := servers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(serve(t, srv)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(reportOf("llm", map[string]string{"model": "gpt"}, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	got := srv.Streams()
	if len(got) != 1 || got[0].Domain != "llm" || got[0].Peer == "" || !got[0].Since.Equal(storetest.T0) || len(got[0].Buckets) != 1 {
		t.Fatalf("Streams() = %+v, want the stream of domain llm with its bucket", got)
	}
	if b := got[0].Buckets[0]; b.ID["model"] != "gpt" || b.Action != actionTokenBucket || len(b.Limits) != 1 {
		t.Errorf("its bucket = %+v, want model=gpt, a token bucket sent, sized by its limit", b)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, want the stream's end", err)
	}
	if got := srv.Streams(); len(got) != 0 {
		t.Errorf("Streams() after the stream's end = %+v, want none", got)
	}
}
