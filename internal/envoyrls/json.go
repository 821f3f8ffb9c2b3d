package envoyrls

import (
	"context"
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/service"
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
	if err := checkJSONShape(body); err != nil {
		http.Error(w, err.Error(), httpStatus(err))
		return
	}
	var in rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &in); err != nil {
		http.Error(w, "bad RateLimitRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.decide(r.Context(), &in)
	if err != nil {
		http.Error(w, err.Error(), httpStatus(err))
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

// httpStatus maps an error of the service to an HTTP status, as grpcStatus
// maps it to a gRPC code. Unlike envoyproxy/ratelimit (400 for everything),
// a store failure is a 5xx.
func httpStatus(err error) int {
	var inv *service.InvalidError
	switch {
	case errors.As(err, &inv):
		return http.StatusBadRequest
	case errors.Is(err, service.ErrStoreUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.Canceled):
		return 499 // client closed request
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
