// Package panics contains panics in the goroutines that serve one caller
// (a connection, a stream, a request), so that a bug reached by one
// caller's input costs that caller an internal error and nothing else: the
// daemon keeps serving everyone else.
//
// A Guard counts every contained panic in tether_panics_total{component}
// and logs it once, with its stack, at error level. The goroutine that
// panicked still ends; the caller's callback reports the failure to its own
// peer (an error frame, a micro error reply, a gRPC status, an HTTP 500).
//
// Containment is for per-caller goroutines only. A panic in a goroutine
// that owns shared state (the coordinator's accept loop, the ledger's
// index watchers, the inventory loop) may have left that state
// half-updated; such goroutines are not guarded, so that the process dies
// and its supervisor restarts it. A per-connection loop whose deferred
// cleanup tears down everything it owns (an agent's tunnel session) is
// per-caller. A guarded goroutine's deferred calls run while the panic
// unwinds, before Recover: any that waits for helpers must first end what
// they wait on (kill the process, close the stream).
//
// This package imports no other Tether package; agent and coordinator both
// use it.
package panics

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricName is the counter every Guard increments, labelled by component.
const MetricName = "tether_panics_total"

// Error is what a Guard hands to the report callback: the panic's value, the
// place that was guarded and the goroutine's stack at the panic.
type Error struct {
	Where string // the guarded operation, e.g. "exec stream"
	Value any    // what was passed to panic
	Stack []byte // debug.Stack() in the deferred call
}

func (e *Error) Error() string { return fmt.Sprintf("internal error in %s: %v", e.Where, e.Value) }

// Unwrap returns the panic value when it is an error (a runtime.Error such
// as an index out of range, or a value passed to panic).
func (e *Error) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// Guard contains panics for one component. The zero value is not usable;
// create one with New. A Guard is safe for concurrent use.
type Guard struct {
	component string
	log       *slog.Logger
	count     prometheus.Counter
}

// New returns a Guard for component ("agent", "coordinator",
// "facade_openshell", ...), counting into reg (nil: not registered) and
// logging to log (nil: discarded). Several Guards, of one component or
// several, may share one registry: the counter vector is registered once
// and reused.
func New(reg prometheus.Registerer, log *slog.Logger, component string) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricName,
		Help: "Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.",
	}, []string{"component"})
	if reg != nil {
		if err := reg.Register(vec); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(fmt.Sprintf("panics: register %s: %v", MetricName, err))
			}
			vec = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return &Guard{component: component, log: log, count: vec.WithLabelValues(component)}
}

// Recover must be deferred directly (defer g.Recover("exec stream", fn)):
// when the goroutine panics it counts and logs the panic, then calls report
// (if not nil) with an *Error, and returns normally so that the goroutine's
// other deferred calls run and it ends without taking the process down.
// A panic inside report is not contained, and neither is
// http.ErrAbortHandler, which is re-raised for net/http to handle.
//
// g may be nil (tests that build a bare value): the panic is then not
// contained.
func (g *Guard) Recover(where string, report func(*Error)) {
	if g == nil {
		return
	}
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		// net/http's signal to drop the connection of an answer that
		// cannot be completed (httputil.ReverseProxy raises it when the
		// upstream breaks mid-body): control flow, not a bug. It goes on
		// to the server untouched, uncounted and unlogged.
		panic(v)
	}
	e := &Error{Where: where, Value: v, Stack: debug.Stack()}
	g.count.Inc()
	g.log.Error("panic contained; the caller got an internal error", "component", g.component,
		"where", where, "panic", fmt.Sprint(v), "stack", string(e.Stack))
	if report != nil {
		report(e)
	}
}

// Go runs f in a new goroutine guarded by g (see Recover), for fire-and-
// forget per-caller work whose owner waits for it by other means.
func (g *Guard) Go(where string, report func(*Error), f func()) {
	go func() {
		defer g.Recover(where, report)
		f()
	}()
}
