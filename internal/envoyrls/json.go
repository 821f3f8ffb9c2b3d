package envoyrls

import (
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds the body of POST /json. The bound holds while the body
// is read: a longer body is refused once its first maxJSONBody+1 bytes are
// in, never read whole.
const maxJSONBody = 1 << 20

// JSON returns the handler of POST /json, envoyproxy/ratelimit's JSON form
// of ShouldRateLimit: the body is a RateLimitRequest in proto3 JSON, the
// answer the RateLimitResponse in proto3 JSON, decided exactly as over gRPC.
// 200 when OK, 429 when OVER_LIMIT, 400 for a bad body or request, 503 when
// the store fails under --on-store-error=error.
func (s *Server) JSON() http.Handler { return http.HandlerFunc(s.serveJSON) }

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	in, err := decodeJSON(body)
	if err != nil {
		http.Error(w, err.Error(), HTTPStatus(err))
		return
	}
	resp, err := s.decide(r.Context(), in)
	if err != nil {
		http.Error(w, err.Error(), HTTPStatus(err))
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// HTTPStatus maps an error of the service to an HTTP status, as grpcStatus
// maps it to a gRPC code. Unlike envoyproxy/ratelimit (400 for everything),
// a store failure is a 5xx.
func HTTPStatus(err error) int {
	switch errorCode(err) {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled:
		return 499 // client closed request
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
