//go:build !tetherclient

package cli

// The full build (the default; `make build` → bin/tether): every command of
// topCommands is linked. The client-only build (-tags tetherclient, `make
// build-client`) compiles build_client.go instead, and none of the files
// that start with `//go:build !tetherclient`.

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// rootBuildNote ends the root command's help: nothing in the full build.
const rootBuildNote = ""

// metricsRegistry returns the registry for `tether dev`: e.registry's, or
// a newRegistry.
func (e *env) metricsRegistry() metricsRegistry {
	if e.registry != nil {
		return e.registry()
	}
	return newRegistry()
}

// newRegistry returns the registry a daemon serves on /metrics: its
// components' metrics plus the Go runtime and process collectors. Beside
// the Go collector's defaults it serves go_gc_heap_live_bytes (the heap the
// last collection found live: what the daemon holds, without the garbage
// go_memstats_heap_inuse_bytes also counts).
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
