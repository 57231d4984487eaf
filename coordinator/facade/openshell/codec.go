package openshell

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// frame is one gRPC message as its raw protobuf bytes. The facade moves
// frames between callers and gateways without decoding them; it decodes a
// copy only where accounting or routing needs a field.
type frame struct{ b []byte }

// rawCodec is a gRPC codec that passes frames through unchanged. It is
// forced on the facade's server (grpc.ForceServerCodecV2) and on every call
// toward a gateway (grpc.ForceCodecV2), never registered globally.
//
// Name is empty on purpose: grpc-go turns a forced codec's non-empty name
// into a content subtype ("application/grpc+<name>"), and the gateway should
// see the plain "application/grpc" that NeMo Gym's Python client sends.
// grpc-go only rejects an empty name at registration.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

// Marshal returns f's bytes. v must be a *frame.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("openshell facade: raw codec cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

// Unmarshal copies data into the *frame v (grpc frees data when Unmarshal
// returns).
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("openshell facade: raw codec cannot unmarshal into %T", v)
	}
	f.b = data.Materialize()
	return nil
}

// Name returns "" (see rawCodec).
func (rawCodec) Name() string { return "" }
