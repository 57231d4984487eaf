package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/internal/monitoring"
)

// The monitoring files checked against the binaries' metrics, relative to
// this package.
var (
	dashboardFile  = filepath.Join("..", "..", "..", "..", "deploy", "grafana", "tether.json")
	alertsFile     = filepath.Join("..", "..", "..", "..", "deploy", "prometheus", "alerts.yml")
	alertTestsFile = filepath.Join("..", "..", "..", "..", "deploy", "prometheus", "alerts_test.yml")
)

// flowMetrics are the tunnel flow-control metrics (issue 13, item 4;
// internal/tunnelmetrics): the dashboard's "Tunnel flow control" row must
// show each, and the binaries must register each.
var flowMetrics = map[string]metricKind{
	"tether_coordinator_tunnel_rtt_seconds":                kindHistogram,
	"tether_coordinator_tunnel_window_stalls_total":        kindOther,
	"tether_coordinator_tunnel_window_stall_seconds_total": kindOther,
	"tether_coordinator_tunnel_send_queued_bytes":          kindOther,
	"tether_agent_tunnel_rtt_seconds":                      kindHistogram,
	"tether_agent_tunnel_window_stalls_total":              kindOther,
	"tether_agent_tunnel_window_stall_seconds_total":       kindOther,
	"tether_agent_tunnel_send_queued_bytes":                kindOther,
}

// prometheusSeries are series Prometheus itself writes for every scrape
// target, which no binary exports.
var prometheusSeries = []string{"up"}

type metricKind int

const (
	kindOther metricKind = iota
	kindHistogram
	kindSummary
)

// series returns the series names a metric of kind k named name is
// queried by: a classic histogram only by its _bucket, _sum and _count, a
// summary by its own name (the quantiles), _sum and _count.
func (k metricKind) series(name string) []string {
	switch k {
	case kindHistogram:
		return []string{name + "_bucket", name + "_sum", name + "_count"}
	case kindSummary:
		return []string{name, name + "_sum", name + "_count"}
	}
	return []string{name}
}

// recordingRegistry is a daemon's registry that also records the name and
// kind of every metric registered on it through Register or MustRegister,
// label vectors without children included (Gather does not list those).
type recordingRegistry struct {
	*prometheus.Registry
	mu    sync.Mutex
	kinds map[string]metricKind
}

func newRecordingRegistry() *recordingRegistry {
	return &recordingRegistry{Registry: newRegistry(), kinds: map[string]metricKind{}}
}

func (r *recordingRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	kind := kindOther
	switch c := c.(type) {
	case *prometheus.HistogramVec:
		kind = kindHistogram
	case *prometheus.SummaryVec:
		kind = kindSummary
	case prometheus.Metric:
		var m dto.Metric
		if err := c.Write(&m); err == nil {
			if m.Histogram != nil {
				kind = kindHistogram
			} else if m.Summary != nil {
				kind = kindSummary
			}
		}
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range ch {
		// Desc has no accessor for its name; its String is
		// `Desc{fqName: "NAME", help: ...}`.
		s := d.String()
		_, rest, ok := strings.Cut(s, `fqName: "`)
		name, _, ok2 := strings.Cut(rest, `"`)
		if !ok || !ok2 || name == "" {
			panic(fmt.Sprintf("recordingRegistry: no fqName in %s", s))
		}
		r.kinds[name] = max(r.kinds[name], kind)
	}
	return nil
}

func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exported returns every series name the registry's metrics are queried
// by: those recorded at registration, and those Gather lists (the
// collectors newRegistry registered before the recording began).
func (r *recordingRegistry) exported(t *testing.T) map[string]bool {
	t.Helper()
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	kinds := maps.Clone(r.kinds)
	r.mu.Unlock()
	for _, mf := range mfs {
		k := kindOther
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			k = kindHistogram
		case dto.MetricType_SUMMARY:
			k = kindSummary
		}
		kinds[mf.GetName()] = max(kinds[mf.GetName()], k)
	}
	out := map[string]bool{}
	for name, k := range kinds {
		for _, s := range k.series(name) {
			out[s] = true
		}
	}
	return out
}

// binariesSeries starts the coordinator as `tether coordinator` does,
// with every optional part on (both facades, the SSH jump host, the
// ledger and reaper, audit), and an agent as `tether agent` does, each on
// its own recording registry; then `tether dev` (runDevRecording), whose
// agent holds a tunnel session and runs a job, so that what registers
// only once a session or a job exists is recorded too. It returns the
// union of the series names they export and the metric names alone (for
// the coverage checks).
func binariesSeries(t *testing.T) (series map[string]bool, metrics []string) {
	t.Helper()
	o := testCoordinatorOptions(t, t.TempDir())
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	if err := os.WriteFile(keys, ssh.MarshalAuthorizedKey(sshPub), 0o600); err != nil {
		t.Fatal(err)
	}
	o.SSHAddr, o.SSHAuthorizedKeys = "127.0.0.1:0", keys
	creg := newRecordingRegistry()
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), creg)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	if cs.gate == nil || cs.sbx == nil || cs.audit == nil {
		t.Fatalf("coordinator started without gate %v, sandboxes %v or audit %v: their metrics would be missing", cs.gate, cs.sbx, cs.audit)
	}

	areg := newRecordingRegistry()
	acfg := agent.DefaultConfig()
	acfg.Coordinators = []string{"127.0.0.1:7000"}
	acfg.TLS = &tls.Config{}
	acfg.DataDir = t.TempDir()
	acfg.Registerer = areg
	if _, err := agent.New(acfg); err != nil {
		t.Fatal(err)
	}

	dreg := runDevRecording(t)

	series = creg.exported(t)
	maps.Copy(series, areg.exported(t))
	maps.Copy(series, dreg.exported(t))
	for _, r := range []*recordingRegistry{creg, areg, dreg} {
		r.mu.Lock()
		metrics = slices.AppendSeq(metrics, maps.Keys(r.kinds))
		r.mu.Unlock()
	}
	slices.Sort(metrics)
	return series, slices.Compact(metrics)
}

// runDevRecording runs `tether dev` (both facades on, free loopback
// ports) on a recording registry until its agent's tunnel is up and one
// job ran through it, and returns the registry; dev stops when the test
// ends.
func runDevRecording(t *testing.T) *recordingRegistry {
	t.Helper()
	dir := t.TempDir()
	reg := newRecordingRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	e := &env{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, getenv: testGetenv(nil), now: time.Now,
		registry: func() metricsRegistry { return reg }}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--data-dir", dir, "--nats-port", "0", "--listen", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--ssh-addr", "", "--log-level", "warn",
			"--openshell-listen", "127.0.0.1:0", "--opensandbox-listen", "127.0.0.1:0"}, e)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("dev exit code %d; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(defaultTestTimeout):
			t.Error("dev did not stop")
		}
	})
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	banner := regexp.MustCompile(`NATS URL: +(nats://\S+)`)
	var url string
	checkFor(t, defaultTestTimeout, func() error {
		select {
		case code := <-done:
			t.Fatalf("dev exited early with %d; stderr:\n%s", code, stderr.String())
		default:
		}
		m := banner.FindStringSubmatch(stdout.String())
		if m == nil {
			return errors.New("no ready banner yet")
		}
		url = m[1]
		if c, a := gauge("tether_coordinator_agents_connected"), gauge("tether_agent_tunnel_connected"); c != 1 || a != 1 {
			return fmt.Errorf("agents connected %v, agent tunnel connected %v; want 1 and 1", c, a)
		}
		return nil
	})
	creds := filepath.Join(dir, "dev.creds")
	r := runCLI(testCtx(t), map[string]string{natsCredsEnv: creds}, "", "exec", "--nats-url", url, "--all", "--", "true")
	if r.code != 0 {
		t.Fatalf("exec through dev: exit %d, stderr %q", r.code, r.stderr)
	}
	return reg
}

// The Grafana dashboard and the Prometheus alert rules and their tests
// query only series the binaries export (or Prometheus writes, or the
// flow-control metrics pending on another branch), and the dashboard
// shows every auth refusal counter and the panics.
func TestMonitoringReferencesOnlyExportedMetrics(t *testing.T) {
	series, metrics := binariesSeries(t)
	t.Logf("%d series names exported by %d metrics", len(series), len(metrics))
	// A sanity floor: a registry that recorded nothing would make every
	// reference unknown, and one that recorded only Gather's list would
	// miss the label vectors.
	for _, must := range []string{"tether_coordinator_agents_connected", "tether_agent_tunnel_connected",
		"tether_sandbox_reaps_total", "tether_openshell_facade_call_duration_seconds_bucket", "tether_ssh_auth_failures_total", "go_goroutines"} {
		if !series[must] {
			t.Fatalf("the binaries' registries lack %s: the catalog is incomplete", must)
		}
	}
	allowed := maps.Clone(series)
	for name, k := range flowMetrics {
		for _, s := range k.series(name) {
			if !series[s] {
				t.Errorf("flow-control series %s (of %s) is not registered by the binaries", s, name)
			}
		}
	}
	for _, s := range prometheusSeries {
		allowed[s] = true
	}

	var exprs []monitoring.Expr
	d, err := monitoring.LoadDashboard(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs = append(exprs, d.Exprs()...)
	exprs = append(exprs, d.VariableExprs()...)
	rules, err := monitoring.LoadRules(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		exprs = append(exprs, monitoring.Expr{Where: "alert " + r.Alert + r.Record, Expr: r.Expr})
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names, err := monitoring.MetricNames(e.Expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", e.Where, err, e.Expr)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: selects no metric: %s", e.Where, e.Expr)
		}
		for _, n := range names {
			if strings.HasPrefix(e.Where, "dashboard") {
				used[n] = true
			}
			if !allowed[n] {
				t.Errorf("%s: %s is not exported by the coordinator or the agent", e.Where, n)
			}
		}
	}

	rt, err := monitoring.LoadRuleTests(alertTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rt.Series {
		n, err := monitoring.SeriesName(s)
		if err != nil {
			t.Errorf("%s: %v", alertTestsFile, err)
		} else if !allowed[n] {
			t.Errorf("%s: input series %s: %s is not exported by the coordinator or the agent", alertTestsFile, s, n)
		}
	}
	if len(rt.RuleFiles) != 1 || filepath.Clean(rt.RuleFiles[0]) != filepath.Clean(alertsFile) {
		t.Errorf("%s loads %q, want only %s", alertTestsFile, rt.RuleFiles, alertsFile)
	}
	neverFiring, neverSilent := rt.Untested(rules)
	if len(neverFiring) > 0 {
		t.Errorf("%s: no case expects these alerts to fire: %q", alertTestsFile, neverFiring)
	}
	if len(neverSilent) > 0 {
		t.Errorf("%s: no case expects these alerts to stay silent: %q", alertTestsFile, neverSilent)
	}

	// Coverage: every refusal counter and the panics are on the dashboard.
	for _, m := range metrics {
		if (strings.HasSuffix(m, "_auth_failures_total") || m == "tether_coordinator_direct_refusals_total" ||
			m == "tether_panics_total" || strings.HasSuffix(m, "_refusals_total") || strings.HasSuffix(m, "_refused_total")) && !used[m] {
			t.Errorf("dashboard shows no panel of %s", m)
		}
	}
	for name := range flowMetrics {
		found := false
		for _, s := range flowMetrics[name].series(name) {
			found = found || used[s]
		}
		if !found {
			t.Errorf("dashboard shows no panel of the flow-control metric %s", name)
		}
	}
	if !slices.Contains(d.Titles(), "Tunnel flow control") {
		t.Errorf("dashboard has no row \"Tunnel flow control\"; titles: %q", d.Titles())
	}
}

// promtool (Prometheus's own parser) accepts every dashboard expression,
// with Grafana's variables substituted. promtool is $PROMTOOL, else the
// one on PATH; the test is skipped without one unless
// TETHER_REQUIRE_PROMTOOL=1 (make monitoring-check sets it).
func TestMonitoringDashboardExprsParse(t *testing.T) {
	promtool := os.Getenv("PROMTOOL")
	var err error
	if promtool == "" {
		promtool, err = exec.LookPath("promtool")
	}
	if err != nil {
		if os.Getenv("TETHER_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("no promtool: set PROMTOOL or put it on PATH (Debian package prometheus)")
		}
		t.Skip("promtool is not on PATH")
	}
	d, err := monitoring.LoadDashboard(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	// Each expression becomes a recording rule: promtool check rules
	// parses them all and names the rule of any that fails.
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range d.Exprs() {
		fmt.Fprintf(&b, "      # %s\n      - record: dashboard:expr_%d\n        expr: %q\n", strings.ReplaceAll(e.Where, "\n", " "), i, monitoring.Substitute(e.Expr))
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's expressions: %v\n%s\n%s", err, out, b.String())
	}
}
