package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// serveDial serves the dial stream st (protocol.DialParams): it looks the
// target up among the configured targets only (Config.OpenShell,
// Config.OpenSandbox, Config.Targets), connects to its address over TCP
// within Config.DialTimeout, answers FrameDialOK, and then copies raw bytes
// both ways until both directions ended. A name that is not configured is
// answered with CodeUnknownTarget, a connection that fails with
// CodeDialFailed, a dial past Config.MaxDials with CodeBusy; nothing the
// caller names is dialled unless it is configured.
//
// Half-closes pass through: the coordinator's end of its side (a FIN on the
// stream) becomes a CloseWrite on the target connection, and the target's
// EOF becomes a FIN on the stream (yamux Close), while the other direction
// goes on. A read or write error in either direction, or the end of ctx
// (the session), ends both. Like any TCP relay, a connection whose target
// closed keeps its stream until the coordinator closes its side too.
//
// It returns when both directions ended; st and the target connection are
// closed.
func (a *Agent) serveDial(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	if n := a.dialing.Add(1); n > int64(a.cfg.MaxDials) {
		a.dialing.Add(-1)
		a.m.dials.WithLabelValues(dialBusy).Inc()
		a.log.Warn("dial refused: at the limit of open dial streams", "stream", st.StreamID(), "max_dials", a.cfg.MaxDials)
		a.refuse(st, protocol.CodeBusy, fmt.Sprintf("node %s has %d dial streams open, its limit", a.cfg.NodeID, a.cfg.MaxDials))
		return
	}
	a.m.dialsOpen.Inc()
	defer func() {
		a.dialing.Add(-1)
		a.m.dialsOpen.Dec()
	}()
	// After FrameDialOK the stream carries the target's raw bytes, where
	// no frame may follow: a panic then only closes it.
	raw := false
	defer a.guard.Recover("dial stream", func(e *panics.Error) {
		if !raw {
			a.answerPanic(st, nil)(e)
		}
		st.Close()
	})
	log := a.log.With("stream", st.StreamID())
	var p protocol.DialParams
	if err := h.DecodeParams(&p); err != nil {
		a.m.dials.WithLabelValues(dialBadRequest).Inc()
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if lp := a.localPolicy(); lp != nil {
		if err := lp.AllowDial(p.Target); err != nil {
			a.m.dials.WithLabelValues(dialForbidden).Inc()
			log.Warn("dial refused by the local policy", "target", clip(p.Target, 100))
			fi := a.forbidden(err)
			a.refuse(st, fi.Code, fi.Message)
			return
		}
	}
	addr, ok := a.targets[p.Target]
	if !ok {
		// The message names the configured targets, never their
		// addresses.
		a.m.dials.WithLabelValues(dialUnknownTarget).Inc()
		known := "no targets"
		if len(a.targetNames) > 0 {
			known = strings.Join(a.targetNames, ", ")
		}
		log.Warn("dial refused: unknown target", "target", clip(p.Target, 100))
		msg := fmt.Sprintf("node %s has no target %q (it serves: %s)", a.cfg.NodeID, clip(p.Target, 100), known)
		if p.Target == protocol.TargetOwnPorts {
			msg += "; " + protocol.TargetOwnPorts + " is for port forwards inside an SSH connection (ssh -L), as your login"
		}
		a.refuse(st, protocol.CodeUnknownTarget, msg)
		return
	}
	log = log.With("target", p.Target, "addr", addr)
	d := net.Dialer{Timeout: a.cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		a.m.dials.WithLabelValues(dialFailed).Inc()
		// net's error repeats "dial tcp ADDR"; the message says it once.
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err
		}
		log.Warn("dial failed", "err", err)
		a.refuse(st, protocol.CodeDialFailed, fmt.Sprintf("node %s: dial target %s at %s: %v", a.cfg.NodeID, p.Target, addr, err))
		return
	}
	defer conn.Close()
	defer st.Close()
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	if err := protocol.WriteFrame(st, protocol.FrameDialOK, nil); err != nil {
		log.Warn("dial: write dial-ok", "err", err)
		return
	}
	raw = true
	st.SetWriteDeadline(time.Time{})
	a.m.dials.WithLabelValues(dialOK).Inc()
	log.Debug("dial connected")
	start := time.Now()
	up, down := a.relay(ctx, st, conn, log)
	log.Debug("dial closed", "bytes_to_target", up, "bytes_from_target", down, "duration", time.Since(start))
}

// relay copies st to conn and conn to st until both directions ended (see
// serveDial), and returns the bytes copied each way. It does not close st
// or conn fully unless a direction failed or ctx ended; the caller closes
// both.
func (a *Agent) relay(ctx context.Context, st *yamux.Stream, conn net.Conn, log *slog.Logger) (up, downBytes int64) {
	// abort ends both directions: the deadlines unblock a read or write
	// in progress on the stream (its Close would only half-close it), and
	// closing conn unblocks the target side.
	var once sync.Once
	abort := func() {
		once.Do(func() {
			st.SetDeadline(time.Now())
			conn.Close()
		})
	}
	stop := context.AfterFunc(ctx, abort)
	defer stop()

	// Once the coordinator's side has ended (a half-close, or a full close
	// — yamux cannot tell them apart), a write it does not read within
	// halfClosedWriteTimeout means nobody will: give up rather than hold
	// the stream and its dial slot while a target that ignores the
	// half-close keeps sending.
	var upDone atomic.Bool
	down := &halfClosedWriter{st: st, upDone: &upDone}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer upDone.Store(true)
		defer a.guard.Recover("dial copier", func(*panics.Error) { abort() })
		var err error
		up, err = dialCopy(conn, st, a.m.dialBytes.WithLabelValues(toTarget))
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("dial: copy to target ended", "err", err)
			}
			abort()
			return
		}
		// A write to the stream may already be waiting for room, with
		// no deadline: bound it too (yamux applies a new deadline to a
		// blocked write). Later writes set their own.
		upDone.Store(true)
		st.SetWriteDeadline(time.Now().Add(halfClosedWriteTimeout))
		// The coordinator's side is done: pass its EOF on.
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			if err := cw.CloseWrite(); err != nil {
				abort()
			}
		}
	}()
	var err error
	downBytes, err = dialCopy(down, conn, a.m.dialBytes.WithLabelValues(fromTarget))
	if err != nil {
		if ctx.Err() == nil {
			log.Debug("dial: copy from target ended", "err", err)
		}
		abort()
	} else {
		// The target is done: a FIN on the stream, which stays readable.
		st.Close()
	}
	wg.Wait()
	return up, downBytes
}

// halfClosedWriteTimeout bounds one write to a dial stream whose
// coordinator side has ended (see relay).
var halfClosedWriteTimeout = 30 * time.Second

// dialCopy copies one direction of a dial stream, counting into c: through
// pooled buffers that grow to 256 KiB under bulk (countcopy.CopyPooled).
// A variable so that a test can count in fixed 32 KiB steps.
var dialCopy = countcopy.CopyPooled

// halfClosedWriter writes to st, with a deadline per write once upDone.
type halfClosedWriter struct {
	st     *yamux.Stream
	upDone *atomic.Bool
}

func (w *halfClosedWriter) Write(p []byte) (int, error) {
	if w.upDone.Load() {
		w.st.SetWriteDeadline(time.Now().Add(halfClosedWriteTimeout))
	}
	return w.st.Write(p)
}

// clip shortens s to at most n bytes for messages and logs, marking the
// cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
