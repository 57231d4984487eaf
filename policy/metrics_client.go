//go:build tetherclient

package policy

// Metrics, in the client-only build of tether (-tags tetherclient), counts
// nothing and links no Prometheus (whose package initialisation every
// client process would otherwise pay, issue 12): the client commands use
// policy's names and parsing, never a Store. The full build's Metrics and
// NewMetrics are in metrics.go.
type Metrics struct{}

func (*Metrics) refused(Operation, Reason) {}

func (*Metrics) reloaded(bool) {}
