package envoyrls

import (
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/service"
)

// ServerCodec is the gRPC server option for rls's codec: protobuf, except
// for the RateLimitRequest of ShouldRateLimit (as Register registers it),
// which is
//
//   - checked for its shape while it is decoded: a request with more
//     descriptors or entries than the service allows (or none, or a bad
//     domain) is refused with the service's InvalidArgument message before
//     any descriptor is built, so that a 1 MiB request of 262,144
//     descriptors costs a scan of its bytes, not their decoding;
//   - decoded even when its strings are not valid UTF-8. Envoy fills
//     descriptor values from request headers and paths, which may hold any
//     bytes, and its C++ protobuf sends them as they are; Go's protobuf
//     refuses such a string field, and the request would fail with INTERNAL
//     (so Envoy would fall back to its failure mode instead of the limit
//     applying). rls compares and stores values as bytes, and escapes them
//     in keys, so they need not be UTF-8;
//   - InvalidArgument when it cannot be decoded at all, as any malformed
//     request.
func ServerCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{encoding.GetCodecV2(protoenc.Name)})
}

type codec struct{ encoding.CodecV2 }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	w, ok := v.(*wireRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	w.invalid = decodeWire(buf.ReadOnlyData(), w.RateLimitRequest)
	return nil
}

// wireRequest is what ShouldRateLimit's handler decodes a request into: the
// request, and why it is refused when rls's codec refused it while
// decoding. It is a proto.Message (the embedded request's), so that any
// protobuf codec decodes it.
type wireRequest struct {
	*rlsv3.RateLimitRequest
	invalid error
}

// decodeWire decodes b into m (empty) unless its shape breaks the service's
// bounds. It returns a *service.InvalidError for a request refused.
func decodeWire(b []byte, m *rlsv3.RateLimitRequest) error {
	if err := checkShape(b); err != nil {
		return err
	}
	err := proto.Unmarshal(b, m)
	if err != nil && strings.Contains(err.Error(), "invalid UTF-8") {
		proto.Reset(m) // the failed decoding may have filled part of it
		err = decodeRequest(b, m)
	}
	if err != nil {
		return &service.InvalidError{Field: "RateLimitRequest", Msg: "cannot decode: " + err.Error()}
	}
	return nil
}

// checkShape scans the RateLimitRequest b for what service.CheckShape and
// service.CheckEntryCount check, building nothing. Bytes that are not a
// well-formed message are left to the decoder to refuse (nil here).
func checkShape(b []byte) error {
	var (
		domain  []byte
		n       int
		entries [service.MaxDescriptors]int
	)
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			domain = v
		case 2:
			if n < len(entries) {
				i := n
				if err := fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, _ uint64) error {
					if num == 1 && typ == protowire.BytesType {
						entries[i]++
					}
					return nil
				}); err != nil {
					return err
				}
			}
			n++
		}
		return nil
	})
	if err != nil {
		return nil
	}
	if err := service.CheckShape(string(domain), n); err != nil {
		return err
	}
	for i := range n {
		if err := service.CheckEntryCount(i, entries[i]); err != nil {
			return err
		}
	}
	return nil
}

// decodeRequest decodes a RateLimitRequest as proto.Unmarshal does
// (unknown fields and fields of an unexpected wire type are skipped, a
// message field that occurs twice is merged), without checking that strings
// are UTF-8. It knows the fields rls reads; others are dropped.
func decodeRequest(b []byte, m *rlsv3.RateLimitRequest) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := &commonv3.RateLimitDescriptor{}
			if err := decodeDescriptor(v, d); err != nil {
				return err
			}
			m.Descriptors = append(m.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			m.HitsAddend = uint32(x)
		}
		return nil
	})
}

func decodeDescriptor(b []byte, d *commonv3.RateLimitDescriptor) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		if typ == protowire.VarintType && num == 4 {
			d.IsNegativeHits = x != 0
		}
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			e := &commonv3.RateLimitDescriptor_Entry{}
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if typ == protowire.BytesType && num == 1 {
					e.Key = string(v)
				} else if typ == protowire.BytesType && num == 2 {
					e.Value = string(v)
				}
				return nil
			}); err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case 2:
			if d.Limit == nil {
				d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{}
			}
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case typ == protowire.VarintType && num == 1:
					d.Limit.RequestsPerUnit = uint32(x)
				case typ == protowire.VarintType && num == 2:
					d.Limit.Unit = typev3.RateLimitUnit(int32(x))
				case typ == protowire.BytesType && num == 3:
					if d.Limit.UnitMultiplier == nil {
						d.Limit.UnitMultiplier = &wrapperspb.UInt32Value{}
					}
					return fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
						if typ == protowire.VarintType && num == 1 {
							d.Limit.UnitMultiplier.Value = uint32(x)
						}
						return nil
					})
				}
				return nil
			})
		case 3:
			if d.HitsAddend == nil {
				d.HitsAddend = &wrapperspb.UInt64Value{}
			}
			return fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if typ == protowire.VarintType && num == 1 {
					d.HitsAddend.Value = x
				}
				return nil
			})
		}
		return nil
	})
}

// fields calls f for each field of the message b: with the bytes of a
// length-delimited field, or the value of a varint; other wire types are
// skipped.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType || typ == protowire.VarintType {
			if err := f(num, typ, v, x); err != nil {
				return err
			}
		}
	}
	return nil
}
