package opensandbox_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// The fuzzers check that the decoders never panic and that whatever they
// accept re-encodes to an equivalent value. Their seed corpora run as
// ordinary tests.

func FuzzDecodeBinaryFrame(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 2, 'c', 'd'})
	f.Add([]byte("\x00echo hi\n"))
	f.Add([]byte{1})
	f.Add([]byte{3, 0xff})
	f.Add([]byte{0x7f, 1, 2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := opensandbox.DecodeBinaryFrame(data)
		if err != nil {
			if !errors.Is(err, opensandbox.ErrEmptyFrame) && !errors.Is(err, opensandbox.ErrShortReplay) && !errors.Is(err, opensandbox.ErrUnknownChannel) {
				t.Fatalf("unexpected error class: %v", err)
			}
			if !errors.Is(err, opensandbox.ErrUnknownChannel) {
				return
			}
		}
		if again := opensandbox.EncodeBinaryFrame(fr); !bytes.Equal(again, data) {
			t.Fatalf("re-encode % x, want % x", again, data)
		}
	})
}

func FuzzParsePath(f *testing.F) {
	for _, s := range []string{"/v1/sandboxes", "/sandboxes/sb-1", "/v1/sandboxes/sb-1/endpoints/44772", "/sandboxes/a/renew-expiration",
		"/sandboxes/a/proxy/44772/pty/x/ws", "/sandboxes/a/proxy/1/../x", "/v1/sandboxes/", "/sandboxes/a/proxy/0099/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		r, ok := opensandbox.ParsePath(path)
		if !ok {
			if r != (opensandbox.Route{}) {
				t.Fatalf("rejected path returned %+v", r)
			}
			return
		}
		if r.Kind == opensandbox.RouteUnknown {
			t.Fatalf("accepted %q as RouteUnknown", path)
		}
		again, ok := opensandbox.ParsePath(r.Path())
		if !ok || again != r {
			t.Fatalf("%q → %+v → %q → %+v, %v", path, r, r.Path(), again, ok)
		}
	})
}

func FuzzParseMetadataFilter(f *testing.F) {
	for _, s := range []string{"", "a=1", "a=1&broken", "nemo-gym.nvidia.com/run=run-123&team=", "a=%zz+%41", "=&="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := opensandbox.ParseMetadataFilter(s)
		if err != nil {
			if !errors.Is(err, opensandbox.ErrInvalidMetadataFilter) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		enc := opensandbox.EncodeMetadataFilter(m)
		back, err := opensandbox.ParseMetadataFilter(enc)
		if err != nil || len(back) != len(m) {
			t.Fatalf("%q → %v → %q → %v, %v", s, m, enc, back, err)
		}
		for k, v := range m {
			if back[k] != v {
				t.Fatalf("%q → %v → %q → %v", s, m, enc, back)
			}
		}
	})
}

func FuzzSanitizeMetadataValue(f *testing.F) {
	for _, s := range []string{"gym team", "héllo wörld", "", "-.-", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := opensandbox.SanitizeMetadataValue(s)
		if err := opensandbox.ValidateMetadata(map[string]string{"k": v}); err != nil || v == "" {
			t.Fatalf("SanitizeMetadataValue(%q) = %q: %v", s, v, err)
		}
		if opensandbox.SanitizeMetadataValue(v) != v {
			t.Fatalf("not idempotent: %q → %q", s, v)
		}
	})
}
