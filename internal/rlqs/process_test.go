package rlqs_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/rlsproject/rls/internal/proctest"
)

// TestServedByRLS: the rls binary serves RLQS on its gRPC port, lists it
// by reflection (as grpcurl asks), and answers a stream's report.
func TestServedByRLS(t *testing.T) {
	p, err := proctest.Serve(proctest.Options{Name: "rls", Log: filepath.Join(t.TempDir(), "rls.log")}, proctest.RLSBinary(t), `
domain: llm
descriptors:
  - key: model
    value: gpt
    rate_limit: {unit: minute, requests_per_unit: 600}
`, "--log-level", "warn", "--watch=false")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	cc, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	refl, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	listed, err := refl.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range listed.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "envoy.service.rate_limit_quota.v3.RateLimitQuotaService") {
		t.Errorf("reflection lists %v, without the RLQS service", names)
	}

	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "llm", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"model": "gpt"}}, NumRequestsAllowed: 1},
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"model": "other"}}, NumRequestsAllowed: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	actions := resp.GetBucketAction()
	if len(actions) != 2 {
		t.Fatalf("%d actions, want 2: %v", len(actions), resp)
	}
	if tb := actions[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil || tb.GetMaxTokens() == 0 || actions[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() < time.Second {
		t.Errorf("model=gpt: %v, want a token bucket assignment of a second or more", actions[0])
	}
	if rule := actions[1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(); rule.String() != "ALLOW_ALL" {
		t.Errorf("model=other: %v, want ALLOW_ALL", actions[1])
	}
	stream.CloseSend()
}
