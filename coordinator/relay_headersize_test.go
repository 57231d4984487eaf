package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// execParamsOfSize returns exec params without a timeout that are n bytes
// as sent: argv ["ok", "xx…"], each x written as unit (either "x" or an
// escape of it).
func execParamsOfSize(t *testing.T, n int, unit string) string {
	t.Helper()
	head, tail := `"argv":["ok","`, `"]}`
	k := n - 1 - len(head) - len(tail)
	pad := k % len(unit) // JSON whitespace after the "{"
	s := "{" + strings.Repeat(" ", pad) + head + strings.Repeat(unit, (k-pad)/len(unit)) + tail
	if len(s) != n {
		t.Fatalf("params of %d bytes, want %d", len(s), n)
	}
	return s
}

// TestRelayHeaderSizeCountsDefaultTimeout: the stream relay measures exec
// params as the job path does (protocol.CheckHeaderSize): without a
// timeout of their own they must leave room for the coordinator's default
// one, else they are refused with 413 too_large, as tether.v1.exec refuses
// them; with a timeout they may fill the header. And an exec that fits
// always gets the default timeout, even when the client's own encoding
// (escapes where none are needed) leaves no room for it.
func TestRelayHeaderSizeCountsDefaultTimeout(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.DefaultTimeout = 90 * time.Second })
	headers := make(chan protocol.Header, 4)
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, header: func(hd protocol.Header) { headers <- hd }})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	c := client.New(h.client)

	// 10 bytes under the limit: the default timeout would not fit.
	tight := execParamsOfSize(t, protocol.MaxHeaderSize-10, "x")
	st, err := c.OpenStream(ctx, "n1", protocol.KindExec, json.RawMessage(tight))
	var ae *protocol.APIError
	if err == nil {
		st.Close()
		hd := <-headers
		var p protocol.ExecParams
		hd.DecodeParams(&p)
		t.Fatalf("params of %d bytes without a timeout opened a stream (the node got timeout_ms %d)", len(tight), p.TimeoutMS)
	}
	if !errors.As(err, &ae) || ae.Status != 413 || ae.Code != protocol.ErrCodeTooLarge || !strings.Contains(ae.Message, "default timeout") ||
		!strings.Contains(ae.Message, fmt.Sprintf("over the stream header limit of %d bytes", protocol.MaxHeaderSize)) {
		t.Errorf("OpenStream of %d bytes without a timeout = %v, want 413 too_large counting the default timeout", len(tight), err)
	}
	// The job path refuses them alike.
	var p protocol.ExecParams
	if err := json.Unmarshal([]byte(tight), &p); err != nil {
		t.Fatal(err)
	}
	if e := (&protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: p.Argv}).Validate(); e == nil || e.Status != 413 {
		t.Errorf("ExecRequest.Validate of the same argv = %v, want 413", e)
	}

	// With a timeout of their own, the same size fits.
	withTimeout := `{"timeout_ms":1000,` + strings.TrimPrefix(execParamsOfSize(t, protocol.MaxHeaderSize-len(`"timeout_ms":1000,`), "x"), "{")
	st, err = c.OpenStream(ctx, "n1", protocol.KindExec, json.RawMessage(withTimeout))
	if err != nil {
		t.Fatalf("params of %d bytes with a timeout: %v", len(withTimeout), err)
	}
	st.Close()
	select {
	case hd := <-headers:
		if string(hd.Params) != withTimeout {
			t.Errorf("params with a timeout were changed on the way (%d bytes, sent %d)", len(hd.Params), len(withTimeout))
		}
	case <-ctx.Done():
		t.Fatal("the stream did not reach the node")
	}

	// Escaped: 6 bytes for each x as sent, 1 as decoded. Re-encoding the
	// client's bytes with the timeout added would not fit; the node still
	// gets the default timeout.
	escaped := execParamsOfSize(t, protocol.MaxHeaderSize-10, `\u0078`)
	st, err = c.OpenStream(ctx, "n1", protocol.KindExec, json.RawMessage(escaped))
	if err != nil {
		t.Fatalf("escaped params of %d bytes: %v", len(escaped), err)
	}
	st.Close()
	select {
	case hd := <-headers:
		var got protocol.ExecParams
		if err := hd.DecodeParams(&got); err != nil || got.TimeoutMS != 90_000 || len(got.Argv) != 2 || got.Argv[1] != strings.Repeat("x", len(got.Argv[1])) ||
			len(got.Argv[1]) < (protocol.MaxHeaderSize-100)/6 {
			t.Errorf("node got timeout_ms %d, argv of %d, %v; want the default timeout and the argv as sent", got.TimeoutMS, len(got.Argv), err)
		}
	case <-ctx.Done():
		t.Fatal("the stream did not reach the node")
	}
}
