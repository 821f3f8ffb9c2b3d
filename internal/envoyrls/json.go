package envoyrls

import (
	"errors"
	"io"
	"net/http"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
)

// JSON returns the handler of POST /json, envoyproxy/ratelimit's JSON form
// of ShouldRateLimit: the body is a RateLimitRequest in proto3 JSON, the
// answer the RateLimitResponse in proto3 JSON, decided exactly as over gRPC.
// 200 when OK, 429 when OVER_LIMIT, 400 for a bad body or request, 503 when
// the store fails under --on-store-error=error.
//
// The body is checked while it is read (readJSONRequest): a body that
// announces more than maxJSONBody bytes is refused before any of it is
// read, and one that crosses a bound of the service (65 descriptors, a key
// of 257 bytes, …) as soon as the bound is crossed. Such a refusal closes
// the connection instead of reading the rest of the body, which a client
// that sends one had no use for.
func (s *Server) JSON() http.Handler { return http.HandlerFunc(s.serveJSON) }

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	body := &eofReader{r: r.Body}
	var buf []byte
	err := error(&errBodyTooLarge{maxJSONBody})
	if r.ContentLength <= maxJSONBody {
		buf, err = readJSONRequest(body, maxJSONBody, int(r.ContentLength))
	}
	if err != nil {
		if !body.eof {
			stopReading(w, r)
		}
		http.Error(w, err.Error(), HTTPStatus(err))
		return
	}
	in, err := decodeJSON(buf)
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

// eofReader reads r and records whether it reached its end.
type eofReader struct {
	r   io.Reader
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.EOF) {
		e.eof = true
	}
	return n, err
}

// stopReading makes the answer to r the last on its connection, and the
// server read none of the body that r has not read: over HTTP/1 the
// connection closes after the answer (Connection: close; without the
// read deadline, net/http would still read up to 256 KiB of the body
// looking for its end). Over HTTP/2 only the stream ends (a reset), which
// the server does when the handler returns with the body unread.
func stopReading(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 {
		return
	}
	w.Header().Set("Connection", "close")
	http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// HTTPStatus maps an error of the service to an HTTP status, as grpcStatus
// maps it to a gRPC code. Unlike envoyproxy/ratelimit (400 for everything),
// a store failure is a 5xx.
func HTTPStatus(err error) int {
	var tooLarge *errBodyTooLarge
	var unread *errReadBody
	switch {
	case errors.As(err, &tooLarge), errors.As(err, &unread):
		return http.StatusBadRequest
	}
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
