package envoyrls

import (
	"bytes"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/service"
)

// DecodeJSON decodes a RateLimitRequest in proto3 JSON, as POST /json
// takes it, into a service.Request: the body is checked against the
// service's bounds as /json checks it (readJSONRequest), then protojson
// decodes it (an *service.InvalidError when either fails). For endpoints
// other than /json that take the same body (POST /debug/explain); the
// request is not validated further.
func DecodeJSON(body []byte) (*service.Request, error) {
	checked, err := readJSONRequest(bytes.NewReader(body), len(body), len(body))
	if err != nil {
		return nil, err
	}
	in, err := decodeJSON(checked)
	if err != nil {
		return nil, err
	}
	var r request
	r.fromProto(in)
	return &r.req, nil
}

// decodeJSON decodes a body that readJSONRequest passed; a failure is an
// *service.InvalidError.
func decodeJSON(body []byte) (*rlsv3.RateLimitRequest, error) {
	var in rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &in); err != nil {
		return nil, &service.InvalidError{Field: "body", Msg: "bad RateLimitRequest: " + err.Error()}
	}
	return &in, nil
}
