package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// OpenGated opens the stream at once but writes its header only when the
// gate allows: the peer reads no header before the gate returned (its SYN
// waits for the header, so the peer accepts the stream with it); a closed
// gate, or a ctx ended meanwhile, sends none at all.
func TestOpenGated(t *testing.T) {
	cfg := testConfig()
	c, s := net.Pipe()
	client, server := sessionPair(t, c, s, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	params := protocol.ExecParams{Argv: []string{"true"}}

	// Open: the peer reads no header while the gate still holds.
	release := make(chan error)
	gateRuns := make(chan struct{})
	opened := make(chan error, 1)
	go func() {
		st, err := client.OpenGated(ctx, protocol.KindExec, params, func() error { close(gateRuns); return <-release })
		if st != nil {
			defer st.Close()
		}
		opened <- err
	}()
	headerRead := make(chan error, 1)
	go func() {
		st, err := server.AcceptRaw(ctx)
		if err == nil {
			_, err = server.ReadHeader(st)
		}
		headerRead <- err
	}()
	<-gateRuns // the stream is open
	select {
	case err := <-headerRead:
		t.Fatalf("header read before the gate opened (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	release <- nil
	if err := <-opened; err != nil {
		t.Fatalf("gated open: %v", err)
	}
	if err := <-headerRead; err != nil {
		t.Fatalf("header after the gate opened: %v", err)
	}
	var st *yamux.Stream
	var err error

	// A gate's error: no header; its error returned.
	errNo := errors.New("not recorded")
	go func() {
		_, err := client.OpenGated(ctx, protocol.KindExec, params, func() error { return errNo })
		opened <- err
	}()
	if st, err = server.AcceptRaw(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; !errors.Is(err, errNo) {
		t.Errorf("refused gate: open = %v, want its error", err)
	}
	if _, err := server.ReadHeader(st); err == nil {
		t.Error("the peer read a header through a refused gate")
	}

	// ctx ends while the gate runs: no header either.
	gctx, gcancel := context.WithCancel(ctx)
	go func() {
		_, err := client.OpenGated(gctx, protocol.KindExec, params, func() error { gcancel(); return nil })
		opened <- err
	}()
	if st, err = server.AcceptRaw(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; !errors.Is(err, context.Canceled) {
		t.Errorf("ctx ended in the gate: open = %v, want context.Canceled", err)
	}
	if _, err := server.ReadHeader(st); err == nil {
		t.Error("the peer read a header though ctx ended in the gate")
	}
}

// A stream its opener closed without a header (a gate that refused) is an
// error of that stream only: Accept's io.EOF means the session ended, and
// a caller that stops accepting on it must not stop here. It did: the
// error wrapped the header read's io.EOF, so the coordinator test
// harness's fake agent stopped accepting after one refused exec, and
// every later stream the coordinator opened waited in yamux for an
// acknowledgement that never came (TestRefusedAcceptsStallNode in
// package coordinator).
func TestAcceptHeaderlessStreamIsNotEOF(t *testing.T) {
	c, s := net.Pipe()
	client, server := sessionPair(t, c, s, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	refused := errors.New("refused")
	params := protocol.ExecParams{Argv: []string{"true"}}
	if _, err := client.OpenGated(ctx, protocol.KindExec, params, func() error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("refused open = %v, want the gate's error", err)
	}
	st, _, err := server.Accept(ctx)
	if err == nil || st != nil || errors.Is(err, io.EOF) || server.IsClosed() {
		t.Fatalf("Accept of a headerless stream = %v, %v (session closed: %v); want a stream error, not io.EOF", st, err, server.IsClosed())
	}
	go func() {
		if st, err := client.Open(ctx, protocol.KindExec, params); err == nil {
			st.Close()
		}
	}()
	if st, h, err := server.Accept(ctx); err != nil || h.Kind != protocol.KindExec {
		t.Fatalf("Accept after the headerless stream = %v, %v", h.Kind, err)
	} else {
		st.Close()
	}
}
