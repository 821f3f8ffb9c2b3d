package envoyrls

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/service"
)

// DecodeJSON decodes a RateLimitRequest in proto3 JSON, as POST /json
// takes it, into a service.Request: the body's shape is scanned first
// (an *service.InvalidError when it is out of bounds), then protojson
// decodes it. For endpoints other than /json that take the same body
// (POST /debug/explain); the request is not validated further.
func DecodeJSON(body []byte) (*service.Request, error) {
	if err := checkJSONShape(body); err != nil {
		return nil, err
	}
	var in rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("bad RateLimitRequest: %w", err)
	}
	var r request
	r.fromProto(&in)
	return &r.req, nil
}
