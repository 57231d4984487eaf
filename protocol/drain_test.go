package protocol

import (
	"errors"
	"testing"
	"time"
)

func TestBusyRefusalRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{0, time.Millisecond, 2500 * time.Millisecond, -time.Second, 100 * 24 * time.Hour} {
		b := AppendBusyRefusal(nil, d)
		if len(b) != BusyRefusalSize || !IsBusyRefusalPrefix(b[:5]) {
			t.Fatalf("%v: encoded %q", d, b)
		}
		got, err := ParseBusyRefusal(b)
		if err != nil {
			t.Fatal(err)
		}
		want := min(max(d, 0), (1<<32-1)*time.Millisecond)
		if got != want.Truncate(time.Millisecond) {
			t.Errorf("%v: parsed %v, want %v", d, got, want)
		}
	}
	// A TLS handshake record is no refusal.
	if IsBusyRefusalPrefix([]byte{0x16, 0x03, 0x03, 0x00, 0x7a}) {
		t.Error("a TLS record header taken for a refusal")
	}
	if _, err := ParseBusyRefusal([]byte("TETHER\x02\x01\x00\x00\x00\x01")); !errors.Is(err, ErrNotRefusal) {
		t.Errorf("version 2: err %v, want ErrNotRefusal", err)
	}
}

func TestDrainRetryAfterBounded(t *testing.T) {
	for _, c := range []struct {
		ms   int64
		want time.Duration
	}{{-5, 0}, {1500, 1500 * time.Millisecond}, {1 << 40, MaxDrainRetryAfter}} {
		d := Drain{RetryAfterMS: c.ms}
		if got := d.RetryAfter(); got != c.want {
			t.Errorf("RetryAfterMS %d: %v, want %v", c.ms, got, c.want)
		}
	}
}

func FuzzParseBusyRefusal(f *testing.F) {
	f.Add(AppendBusyRefusal(nil, time.Second))
	f.Add([]byte{0x16, 0x03, 0x01, 0x02, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseBusyRefusal(b)
		if err != nil {
			return
		}
		if d < 0 || !IsBusyRefusalPrefix(b) {
			t.Fatalf("accepted %q as %v", b, d)
		}
	})
}
