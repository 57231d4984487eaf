package agent

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// panicsCount reads tether_panics_total{component="agent"} from reg.
func panicsCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != panics.MetricName {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "component" && l.GetValue() == "agent" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// boomHook panics at point for params whose argv holds word.
func boomHook(point string, v any) {
	if p, ok := v.(*protocol.ExecParams); ok && slices.Contains(p.Argv, "boom-"+point) {
		panic("injected panic at " + point)
	}
}

// A panic in one exec's handler, and one in another exec's output copier,
// each cost that exec an internal error and nothing else: an exec streaming
// output on the same session meanwhile completes with all of it, the
// session keeps serving, and tether_panics_total counts each panic once.
func TestPanicInOneExecLeavesTheOthers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	h := newHarnessWith(t, func(c *Config) {
		c.Registerer = reg
		c.Logger = testLogger(t, logs)
	}, func(a *Agent) { a.testHook = boomHook })

	// The bystander: streaming, then waiting on stdin, then streaming more.
	const lines = 20000
	other := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv:  []string{"bash", "-c", fmt.Sprintf("seq 1 %d; read x; seq 1 %d; echo end", lines, lines)},
		Stdin: true,
	})
	other.until(t, "the bystander's first lines", func() bool { return strings.Contains(other.stdout.String(), "\n100\n") })

	// A panic in the handler.
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true", "boom-exec"}})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeInternal || !strings.Contains(e.errInfo.Message, "injected panic at exec") {
		t.Fatalf("panicking exec: exit %+v, error %+v; want an internal error naming the panic", e.exit, e.errInfo)
	}
	if n := panicsCount(t, reg); n != 1 {
		t.Errorf("tether_panics_total{component=agent} = %v after one panic, want 1", n)
	}

	// A panic in a helper goroutine (the output copier) of an exec whose
	// process would run for minutes: the group is killed, the exec ends.
	start := time.Now()
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", "echo x; exec sleep 300", "boom-exec-output"}})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeInternal || !strings.Contains(e.errInfo.Message, "injected panic at exec-output") {
		t.Fatalf("exec whose copier panicked: exit %+v, error %+v; want an internal error", e.exit, e.errInfo)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("the crashed exec took %v: its process was not killed", d)
	}
	if n := panicsCount(t, reg); n != 2 {
		t.Errorf("tether_panics_total{component=agent} = %v after two panics, want 2", n)
	}

	// The bystander finishes with every byte.
	other.send(t, protocol.FrameStdin, []byte("\n"))
	other.send(t, protocol.FrameStdinClose, nil)
	other.finish(t)
	var want strings.Builder
	for range 2 {
		for i := 1; i <= lines; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
	}
	want.WriteString("end\n")
	if other.exit == nil || other.exit.ExitCode != 0 || other.stdout.String() != want.String() {
		t.Fatalf("bystander: exit %+v, error %+v, %d of %d stdout bytes", other.exit, other.errInfo, other.stdout.Len(), want.Len())
	}

	// The session still serves.
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "echo after"})
	e.finish(t)
	if e.exit == nil || e.stdout.String() != "after\n" {
		t.Fatalf("exec after the panics: exit %+v, error %+v", e.exit, e.errInfo)
	}
	select {
	case <-h.done:
		t.Fatal("the session ended")
	default:
	}
	// Each stack was logged once.
	if n := strings.Count(logs.String(), "panic contained"); n != 2 {
		t.Errorf("%d 'panic contained' log lines, want 2", n)
	}
}
