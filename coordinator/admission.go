package coordinator

import (
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/protocol"
)

// errNoFirstByte is returned by waitFirstByte when the peer closed the
// connection without sending anything.
var errNoFirstByte = errors.New("closed before sending a byte")

// waitFirstByte waits until conn has a byte to read, without consuming it,
// or until deadline (a timeout error). A connection closed or reset before
// its first byte yields errNoFirstByte. Connections it cannot peek at (not
// a socket: in-memory pipes in tests) return nil at once and are bounded by
// the handshake's own deadline only.
func waitFirstByte(conn net.Conn, deadline time.Time) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	var b [1]byte
	var peekErr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EWOULDBLOCK || err == unix.EINTR:
			return false // not readable yet: wait (until the deadline)
		case err != nil:
			peekErr = errNoFirstByte // reset, or the like
		case n == 0:
			peekErr = errNoFirstByte // orderly close
		}
		return true
	})
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return errNoFirstByte
		}
		return err
	}
	return peekErr
}

// The paced admission of agent TLS handshakes (Config.AdmitRate) and the
// drain's hand-off of agents (drainSessions).

// validatePacing reports the pacing fields' problems (Config.Validate).
func (c *Config) validatePacing() []error {
	var errs []error
	if c.AdmitCPUShare < 0 || c.AdmitCPUShare > 1 {
		errs = append(errs, fmt.Errorf("coordinator config: AdmitCPUShare %v is not in (0, 1]", c.AdmitCPUShare))
	}
	if c.AdmitBurst < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: AdmitBurst %d is negative", c.AdmitBurst))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: MaxRetryAfter %v is negative", c.MaxRetryAfter))
	}
	return errs
}

// Pacing defaults (Config).
const (
	DefaultAdmitCPUShare = 0.25
	DefaultMaxRetryAfter = 30 * time.Second
)

// newPacer returns the pacer cfg asks for (nil: none), filling cfg's
// pacing defaults: a zero AdmitRate becomes the measured one.
func newPacer(cfg *Config) *admission.Pacer {
	if cfg.AdmitRate < 0 {
		return nil
	}
	if cfg.AdmitCPUShare == 0 {
		cfg.AdmitCPUShare = DefaultAdmitCPUShare
	}
	if cfg.MaxRetryAfter == 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.AdmitRate == 0 {
		cfg.AdmitRate = admission.RateFor(cfg.AdmitCPUShare)
	}
	if cfg.AdmitBurst == 0 {
		cfg.AdmitBurst = max(16, int(cfg.AdmitRate/10))
	}
	return admission.NewPacer(cfg.AdmitRate, cfg.AdmitBurst, cfg.MaxRetryAfter, nil)
}

// expectReturning announces to the pacer the agents the fleet registry,
// just loaded, says this coordinator held: records naming it that its
// predecessor (killed, so it did not remove them) left behind, whose
// agents are redialing now. Their storm is spread over
// admission.StormWindow (Pacer.Expect); a handful is admitted at once.
func (c *Coordinator) expectReturning() {
	if c.pacer == nil {
		return
	}
	c.fl.mu.Lock()
	n := 0
	for _, r := range c.fl.recs {
		if r.info.Coordinator == c.cfg.ID {
			n++
		}
	}
	c.fl.mu.Unlock()
	if n == 0 {
		return
	}
	c.pacer.Expect(n)
	if spread := c.pacer.StormSpread(n); spread > 0 {
		c.log.Info("agents held before the restart are coming back: spreading their admissions", "agents", n, "spread", spread)
	}
}

// pacingMetrics are the paced admission's collectors.
type pacingMetrics struct {
	paced prometheus.Counter
}

func newPacingMetrics(reg prometheus.Registerer, p *admission.Pacer) (*pacingMetrics, error) {
	m := &pacingMetrics{paced: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_coordinator_handshakes_paced_total",
		Help: "Agent connections answered with a busy refusal and a retry-after, before TLS, because handshakes were at the admission rate.",
	})}
	// A function of the pacer: SetLimits changes the rate while serving.
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_coordinator_admit_rate_per_second",
		Help: "Agent TLS handshakes a second the coordinator starts at most (0: not paced).",
	}, func() float64 {
		if p == nil {
			return 0
		}
		return p.Rate()
	})
	for _, c := range []prometheus.Collector{m.paced, g} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("coordinator: register metrics: %w", err)
		}
	}
	return m, nil
}

// pace admits raw, a connection from src whose ClientHello has arrived,
// to its TLS handshake (admission.Pacer), or answers it with a busy refusal and reports false; the
// caller then closes it. The refusal costs no handshake: 12 bytes are
// written, and the connection is read until the agent closes it.
func (c *Coordinator) pace(raw net.Conn, src netip.Prefix) bool {
	if c.pacer == nil {
		return true
	}
	ok, wait := c.pacer.Admit(src)
	if ok {
		return true
	}
	c.pm.paced.Inc()
	raw.SetWriteDeadline(time.Now().Add(time.Second))
	raw.Write(protocol.AppendBusyRefusal(nil, wait))
	if cw, ok := raw.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	// A lingering close: read what the agent sent (its ClientHello) until
	// it closes, having read the refusal, or a second passed. Closing with
	// bytes unread would send a reset, which may reach the agent before
	// the refusal and discard it.
	raw.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(raw, 64<<10))
	return false
}

// drainSessions tells every session of sessions that the coordinator is
// going away, then sends each a yamux GoAway (no new streams; the ones in
// flight go on). Agents that take drains (protocol.FeatureDrain) get a
// Drain whose RetryAfterMS staggers them evenly, in random order, over
// Config.DrainSpread, so that they do not all land on one peer at once.
// It returns once every hint was written or failed (each bounded by the
// tunnel's write timeout).
func (c *Coordinator) drainSessions(sessions []*node) {
	var takers []*node
	for _, n := range sessions {
		if n.hello.HasFeature(protocol.FeatureDrain) {
			takers = append(takers, n)
		}
	}
	spread := c.Limits().DrainSpread
	if spread == 0 && c.pacer != nil {
		// The time to admit them at the rate, and at least the storm
		// window when they are more than the burst: the spread a
		// restarted coordinator gives its agents (Pacer.StormSpread),
		// here given by the one that knows how many are leaving.
		spread = time.Duration(float64(len(takers)) / c.pacer.Rate() * float64(time.Second))
		spread = min(max(spread, c.pacer.StormSpread(len(takers))), c.cfg.DrainTimeout/2)
	}
	spread = max(spread, 0)
	order := mrand.Perm(len(takers))
	var wg sync.WaitGroup
	for i, n := range takers {
		after := spread * time.Duration(order[i]) / time.Duration(len(takers))
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.ctl.drain(&protocol.Drain{RetryAfterMS: after.Milliseconds(),
				Message: fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID)})
			if err != nil {
				c.log.Debug("drain hint not sent", "node_id", n.id, "err", err)
			}
		}()
	}
	wg.Wait()
	// GoAway after the hints: an agent reads its hint before it sees
	// the session refuse new streams.
	for _, n := range sessions {
		n.sess.GoAway()
	}
	wg.Wait()
	c.log.Info("agents told to move", "agents", len(sessions), "spread", spread)
}

// drain writes FrameDrain on the control stream, waiting at most the
// write timeout; nothing once a write failed or before Welcome.
func (w *controlWriter) drain(d *protocol.Drain) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if !w.open {
		return nil
	}
	w.st.SetWriteDeadline(time.Now().Add(w.timeout))
	defer w.st.SetWriteDeadline(time.Time{})
	if err := protocol.WriteJSONFrame(w.st, protocol.FrameDrain, d); err != nil {
		w.err = fmt.Errorf("write drain frame on the control stream: %w", err)
		return w.err
	}
	return nil
}
