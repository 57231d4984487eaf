package coordinator

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tetherfleet/tether/internal/admission"
)

// Limits are the settings of a running Coordinator that SetLimits changes
// without dropping a session or a job: `tether coordinator` applies them
// when SIGHUP re-reads its config file. Every other Config field is fixed
// by New.
type Limits struct {
	// MaxHandshakesPerSource is Config.MaxHandshakesPerSource; zero means
	// DefaultMaxHandshakesPerSource. Handshakes in progress keep their
	// place; the new bound applies to the next one from each source.
	MaxHandshakesPerSource int
	// DefaultTimeout is Config.DefaultTimeout; zero means none. Jobs and
	// streams already running keep the timeout they started with.
	DefaultTimeout time.Duration
	// DrainSpread is Config.DrainSpread, for the next drain.
	DrainSpread time.Duration
	// AdmitRate is Config.AdmitRate: positive, the agent TLS handshakes a
	// second; zero, the measured rate (Config.AdmitCPUShare). Pacing can
	// be neither turned on nor off while serving: with pacing off
	// (Config.AdmitRate negative) it must stay negative, with pacing on
	// it must not become negative. The burst stays as New set it.
	AdmitRate float64
}

// LimitError is one Limits field that Validate or SetLimits refused. A
// caller that set the field from a setting of its own (a config file's
// key) finds each with errors.As (through errors.Join's list) and names
// its setting instead of the field.
type LimitError struct {
	// Field is the Limits field's name, e.g. "AdmitRate".
	Field string
	// Value is the refused value, as the field holds it.
	Value any
	// Problem says what is wrong with Value, without the field's name:
	// "is negative".
	Problem string
}

// Error is "coordinator limits: FIELD VALUE PROBLEM".
func (e *LimitError) Error() string {
	return fmt.Sprintf("coordinator limits: %s %v %s", e.Field, e.Value, e.Problem)
}

// Validate reports every problem of l, each a *LimitError (joined).
func (l Limits) Validate() error {
	var errs []error
	if l.MaxHandshakesPerSource < 0 {
		errs = append(errs, &LimitError{"MaxHandshakesPerSource", l.MaxHandshakesPerSource, "is negative"})
	}
	if l.DefaultTimeout < 0 {
		errs = append(errs, &LimitError{"DefaultTimeout", l.DefaultTimeout, "is negative"})
	}
	if math.IsNaN(l.AdmitRate) || math.IsInf(l.AdmitRate, 0) {
		errs = append(errs, &LimitError{"AdmitRate", l.AdmitRate, "is not a number of handshakes a second"})
	}
	return errors.Join(errs...)
}

// Limits returns the limits in force, with defaults filled in.
func (c *Coordinator) Limits() Limits {
	if l := c.limits.Load(); l != nil {
		return *l
	}
	return Limits{
		MaxHandshakesPerSource: c.cfg.MaxHandshakesPerSource,
		DefaultTimeout:         c.cfg.DefaultTimeout,
		DrainSpread:            c.cfg.DrainSpread,
		AdmitRate:              c.cfg.AdmitRate, // New filled in the measured one
	}
}

// CheckLimits reports whether SetLimits would put l in force, with the
// errors SetLimits would return, changing nothing: a caller that applies
// the limits with other settings (a SIGHUP's config file and policy)
// checks them all before it applies any.
func (c *Coordinator) CheckLimits(l Limits) error {
	_, err := c.checkLimits(l)
	return err
}

// checkLimits is l with its defaults filled in, or SetLimits's refusal.
func (c *Coordinator) checkLimits(l Limits) (Limits, error) {
	if err := l.Validate(); err != nil {
		return l, err
	}
	if l.MaxHandshakesPerSource == 0 {
		l.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	switch {
	case c.pacer == nil && l.AdmitRate >= 0:
		return l, &LimitError{"AdmitRate", l.AdmitRate, "would turn handshake pacing on: it is off (the rate was negative at start), and turning it on needs a restart"}
	case c.pacer != nil && l.AdmitRate < 0:
		return l, &LimitError{"AdmitRate", l.AdmitRate, "would turn handshake pacing off (a negative rate): it is on, and turning it off needs a restart"}
	case l.AdmitRate == 0:
		l.AdmitRate = admission.RateFor(c.cfg.AdmitCPUShare)
	}
	return l, nil
}

// SetLimits puts l in force at once. It is safe to call concurrently with
// everything, also while serving; an invalid l changes nothing. Its
// errors are *LimitError (Validate's, joined, or the one refusing to turn
// pacing on or off).
func (c *Coordinator) SetLimits(l Limits) error {
	l, err := c.checkLimits(l)
	if err != nil {
		return err
	}
	c.limitsMu.Lock()
	defer c.limitsMu.Unlock()
	c.admit.SetPerSource(l.MaxHandshakesPerSource)
	if c.pacer != nil {
		c.pacer.SetRate(l.AdmitRate)
	}
	c.limits.Store(&l)
	return nil
}
