package openshell

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// FuzzCreateMetadata reads a caller's tether-* metadata as a create does:
// the TTL (call.ttl) is either refused with INVALID_ARGUMENT naming
// tether-ttl, the value clipped, or a duration that is not negative
// (whole seconds exactly as many seconds); and none of the facade's own
// keys, pseudo-headers or transport headers reaches a gateway (cleanMD).
func FuzzCreateMetadata(f *testing.F) {
	for _, s := range []string{"", "0", "5400", "90m", "-1", "-5m", "1e3", "4294967296", "18446744073709551616", "-18446744073709551616", "2562047h47m16.854775808s", strings.Repeat("9", 5000)} {
		f.Add(s, "tether-node", "x")
	}
	f.Add("1s", ":authority", "evil")
	f.Add("1s", "Tether-Token", "t")
	f.Fuzz(func(t *testing.T, ttl, key, val string) {
		md := metadata.MD{}
		if ttl != "" {
			md.Set(MetaTTL, ttl)
		}
		md.Append(key, val) // metadata.MD lower-cases keys, as gRPC does
		c := &call{s: &Server{cfg: Config{DefaultTTL: time.Hour}}, md: md}
		d, err := c.ttl()
		if err != nil {
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), MetaTTL) || len(st.Message()) > 400 {
				t.Fatalf("ttl %.100q: refused with %v", ttl, err)
			}
		} else {
			if d < 0 {
				t.Fatalf("ttl %q: accepted as %v", ttl, d)
			}
			if ttl == "" && d != time.Hour {
				t.Fatalf("no ttl: %v, want the default", d)
			}
		}
		for k := range cleanMD(md) {
			if strings.HasPrefix(k, "tether-") || strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") {
				t.Fatalf("metadata %q passes to the gateway", k)
			}
		}
	})
}

// FuzzSandboxMessages decodes a gateway's Sandbox message as the facade's
// list does without a full decode: sandboxMeta (the metadata, field by
// field, repeated occurrences merged) gives what proto.Unmarshal of the
// whole Sandbox gives, whenever that succeeds.
func FuzzSandboxMessages(f *testing.F) {
	sb, _ := proto.Marshal(&openshell.Sandbox{Metadata: &openshell.ObjectMeta{Id: "id-1", Name: "n", Labels: map[string]string{"a": "b"}}})
	f.Add(sb)
	f.Add(append(append([]byte{}, sb...), sb...))
	f.Add([]byte{0x0a, 0x80})
	f.Add([]byte{0x0b, 0x0c})
	f.Fuzz(func(t *testing.T, b []byte) {
		meta, err := sandboxMeta(b)
		var whole openshell.Sandbox
		if proto.Unmarshal(b, &whole) == nil {
			if err != nil {
				t.Fatalf("% x: proto decodes the Sandbox, sandboxMeta fails: %v", b, err)
			}
			want := whole.GetMetadata()
			if want == nil {
				want = &openshell.ObjectMeta{}
			}
			if !proto.Equal(meta, want) {
				t.Fatalf("% x: sandboxMeta %v, proto %v", b, meta, want)
			}
		}
	})
}
