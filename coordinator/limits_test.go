package coordinator_test

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
)

// SetLimits applies to a serving coordinator: a per-source handshake bound
// lowered at run time refuses the next handshake from a source at it, and
// raised again admits it; an invalid Limits changes nothing.
func TestSetLimitsPerSourceLive(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.MaxHandshakesPerSource = 4
		c.FirstByteTimeout = time.Minute // the held connections keep their places
		c.HandshakeTimeout = time.Minute
	})
	if got := h.c.Limits().MaxHandshakesPerSource; got != 4 {
		t.Fatalf("Limits().MaxHandshakesPerSource = %d, want 4", got)
	}
	hold := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	hold()
	hold()
	l := h.c.Limits()
	l.MaxHandshakesPerSource = 2
	if err := h.c.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	// A third connection from the same source is closed at once, counted
	// as source_limit.
	checkFor(t, defaultTestTimeout, func() error {
		extra := hold()
		extra.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		if _, err := extra.Read(make([]byte, 1)); isTimeoutErr(err) {
			t.Fatalf("extra connection: %v; want it closed at once", err)
		}
		if got := h.metric("tether_coordinator_auth_failures_total", "reason", "source_limit"); got < 1 {
			return fmt.Errorf("auth_failures{source_limit} = %v", got)
		}
		return nil
	})
	bad := l
	bad.DefaultTimeout = -time.Second
	if err := h.c.SetLimits(bad); err == nil {
		t.Fatal("SetLimits with a negative DefaultTimeout: no error")
	}
	if got := h.c.Limits(); got != l {
		t.Fatalf("Limits after a refused SetLimits = %+v, want %+v", got, l)
	}
	// The admission rate changes, and so does its gauge; pacing cannot
	// be turned off while serving.
	l.AdmitRate = 123
	if err := h.c.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	if got := h.metric("tether_coordinator_admit_rate_per_second"); got != 123 {
		t.Errorf("tether_coordinator_admit_rate_per_second = %v after SetLimits, want 123", got)
	}
	off := l
	off.AdmitRate = -1
	if err := h.c.SetLimits(off); err == nil {
		t.Error("SetLimits turning pacing off: no error")
	} else if le := (*coordinator.LimitError)(nil); !errors.As(err, &le) || le.Field != "AdmitRate" {
		t.Errorf("SetLimits turning pacing off: %v, want a *LimitError for AdmitRate", err)
	}
	if got := h.c.Limits().AdmitRate; got != 123 {
		t.Errorf("AdmitRate after a refused SetLimits = %v, want 123", got)
	}
	// Raised: the agent gets a place beside the two held connections.
	l.MaxHandshakesPerSource = 3
	if err := h.c.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		a := h.dialAgent(t, agentOpts{id: "n1"})
		if a.reject != nil {
			return errors.New("rejected: " + a.reject.Error())
		}
		return nil
	})
}

// Validate reports every problem of a Limits, not the first one only.
func TestLimitsValidateNamesEveryProblem(t *testing.T) {
	err := coordinator.Limits{MaxHandshakesPerSource: -1, DefaultTimeout: -time.Second, AdmitRate: math.NaN()}.Validate()
	if err == nil {
		t.Fatal("no error for three bad fields")
	}
	for _, want := range []string{"MaxHandshakesPerSource -1", "DefaultTimeout -1s", "AdmitRate NaN"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	// Each problem is a *LimitError naming its field, for a caller to map
	// to its own setting (tether coordinator's config keys).
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if le := (*coordinator.LimitError)(nil); errors.As(e, &le) {
			fields = append(fields, le.Field)
		}
	}
	if want := []string{"MaxHandshakesPerSource", "DefaultTimeout", "AdmitRate"}; !slices.Equal(fields, want) {
		t.Errorf("LimitError fields = %q, want %q", fields, want)
	}
	if err := (coordinator.Limits{DrainSpread: -time.Second}).Validate(); err != nil {
		t.Errorf("a negative DrainSpread (no stagger) is valid: %v", err)
	}
}
