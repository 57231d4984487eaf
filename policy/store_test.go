package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const (
	stagingOnly = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=staging"
        operations: [exec]
        run_as: deploy
`
	prodToo = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env in (staging,prod)"
        operations: [exec]
        run_as: deploy
`
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	// Write beside and rename, as an editor or a config map would: a
	// reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newTestStore(t *testing.T, data string) (*Store, string, *prometheus.Registry) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, data)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(path, m)
	if err != nil {
		t.Fatal(err)
	}
	return s, path, reg
}

// TestReloadChangesDecision: a reload of an edited file changes the
// decision; a reload of a broken file keeps the policy in force and says
// why.
func TestReloadChangesDecision(t *testing.T) {
	s, path, reg := newTestStore(t, stagingOnly)
	if _, err := s.Decide(alice, OpExec, nodeB, Object{}); err == nil {
		t.Fatal("exec on prod allowed before the reload")
	}
	writeFile(t, path, prodToo)
	p, err := s.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if p != s.Policy() {
		t.Error("Reload returned a policy other than the one in force")
	}
	if _, err := s.Decide(alice, OpExec, nodeB, Object{}); err != nil {
		t.Fatalf("exec on prod refused after the reload: %v", err)
	}

	before := s.Policy()
	writeFile(t, path, strings.Replace(stagingOnly, "run_as: deploy", "run_as: 0", 1))
	if _, err := s.Reload(); err == nil || !strings.Contains(err.Error(), "policy reload failed, the policy loaded before stays in force") ||
		!strings.Contains(err.Error(), "policy.yaml:7:17: identities[\"nats:alice\"].rules[0].run_as: want a string, got the integer 0") {
		t.Fatalf("reload of a bad file: %v", err)
	}
	if s.Policy() != before {
		t.Error("a failed reload replaced the policy")
	}
	if _, err := s.Decide(alice, OpExec, nodeB, Object{}); err != nil {
		t.Errorf("the old policy's grant is gone after a failed reload: %v", err)
	}
	os.Remove(path)
	if _, err := s.Reload(); err == nil || s.Policy() != before {
		t.Errorf("reload of a missing file: %v", err)
	}

	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tether_policy_reloads_total Policy reloads, by result (error: the old policy was kept).
# TYPE tether_policy_reloads_total counter
tether_policy_reloads_total{result="error"} 2
tether_policy_reloads_total{result="ok"} 1
`), "tether_policy_reloads_total"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(s.metrics.refusals.WithLabelValues("exec", "no_rule")); got != 1 {
		t.Errorf("refusals{exec,no_rule} = %v, want 1", got)
	}
}

// TestReloadConcurrent: decisions during reloads see one policy or the
// other, never a mix or nil (run with -race).
func TestReloadConcurrent(t *testing.T) {
	s, path, _ := newTestStore(t, stagingOnly)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad error
	var mu sync.Mutex
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// node-a is staging: every version of the file grants it.
				if _, err := s.Decide(alice, OpExec, nodeA, Object{}); err != nil {
					mu.Lock()
					bad = err
					mu.Unlock()
				}
			}
		}()
	}
	for i := range 50 {
		data := stagingOnly
		if i%2 == 1 {
			data = prodToo
		}
		writeFile(t, path, data)
		if _, err := s.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad != nil {
		t.Errorf("a decision during reloads failed: %v", bad)
	}
}

func TestNewStoreBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeFile(t, path, "version: 1\n")
	if _, err := NewStore(path, nil); err == nil || !strings.Contains(err.Error(), "identities is missing") {
		t.Errorf("NewStore: %v", err)
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestLimiterRate(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	reg := prometheus.NewRegistry()
	m, _ := NewMetrics(reg)
	l := NewLimiter(m)
	l.Now = clock.Now
	p := mustParse(t, "version: 1\nidentities:\n  nats:alice:\n    limits: {requests_per_second: 2, burst: 3}\n")
	lim := p.Limits(alice)
	for i := range 3 {
		if err := l.Allow(alice, OpExec, lim); err != nil {
			t.Fatalf("request %d of the burst: %v", i, err)
		}
	}
	err := l.Allow(alice, OpExec, lim)
	var r *Refusal
	if !errors.As(err, &r) || r.Reason != ReasonRateLimit {
		t.Fatalf("4th request: %v, want a rate refusal", err)
	}
	if want := `nats:alice may not exec now: over its limit of 2 requests per second (burst 3), set by identities["nats:alice"].limits (policy.yaml:4:13)`; err.Error() != want {
		t.Errorf("message\n  %s\nwant\n  %s", err, want)
	}
	// Another caller has its own budget.
	if err := l.Allow(bob, OpExec, lim); err != nil {
		t.Errorf("bob refused for alice's use: %v", err)
	}
	clock.Advance(500 * time.Millisecond) // one token at 2/s
	if err := l.Allow(alice, OpExec, lim); err != nil {
		t.Errorf("after 0.5 s: %v", err)
	}
	if err := l.Allow(alice, OpExec, lim); err == nil {
		t.Error("a second request after 0.5 s was allowed")
	}
	// A reload that raises the limit applies from the next request on:
	// time before it refilled at the old rate, and raising the burst hands
	// out no fresh burst at once.
	clock.Advance(time.Second) // 2 tokens at 2/s
	lim.RequestsPerSecond, lim.Burst = 100, 10
	for i := range 2 {
		if err := l.Allow(alice, OpExec, lim); err != nil {
			t.Fatalf("request %d refilled at the old rate: %v", i, err)
		}
	}
	clock.Advance(100 * time.Millisecond) // 10 tokens at 100/s
	for i := range 10 {
		if err := l.Allow(alice, OpExec, lim); err != nil {
			t.Fatalf("request %d after raising the limit: %v", i, err)
		}
	}
	if err := l.Allow(alice, OpExec, lim); err == nil {
		t.Error("request 11 after raising the burst to 10 was allowed")
	}
	if got := testutil.ToFloat64(m.refusals.WithLabelValues("exec", "rate_limit")); got != 3 {
		t.Errorf("refusals{exec,rate_limit} = %v, want 3", got)
	}
}

func TestLimiterJobs(t *testing.T) {
	l := NewLimiter(nil)
	lim := Limits{MaxConcurrentJobs: 2, RequestsPerSecond: 1, Burst: 1, jobsFrom: "defaults.limits (p.yaml:3:3)"}
	r1, err := l.Acquire(alice, OpExec, lim)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire(alice, OpExec, lim)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(alice, OpShell, lim)
	if want := "nats:alice may not shell now: it runs 2 jobs, its limit max_concurrent_jobs is 2, set by defaults.limits (p.yaml:3:3)"; err == nil || err.Error() != want {
		t.Fatalf("3rd job: %v, want %s", err, want)
	}
	if _, err := l.Acquire(bob, OpExec, lim); err != nil {
		t.Errorf("bob refused for alice's jobs: %v", err)
	}
	r1()
	r1() // a second release must not free another slot
	if got := l.Running(alice); got != 1 {
		t.Errorf("running after one release (twice) = %d, want 1", got)
	}
	r3, err := l.Acquire(alice, OpExec, lim)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := l.Acquire(alice, OpExec, lim); err == nil {
		t.Error("a 3rd job was allowed after release and reacquire")
	}
	r2()
	r3()
	if got := l.Running(alice); got != 0 {
		t.Errorf("running = %d, want 0", got)
	}
}

// TestLimiterSweep: idle callers are forgotten, so callers that come and
// go do not grow the Limiter; a caller with a running job is kept.
func TestLimiterSweep(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	l := NewLimiter(nil)
	l.Now = clock.Now
	lim := DefaultLimits()
	release, err := l.Acquire(alice, OpExec, lim)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 * minSweep {
		id := Identity{Kind: KindToken, Name: "t" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}
		if err := l.Allow(id, OpAdmin, lim); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			clock.Advance(10 * time.Second) // refills every bucket so far
		}
	}
	l.mu.Lock()
	n := len(l.callers)
	l.mu.Unlock()
	if n > 2*minSweep+100 {
		t.Errorf("%d callers kept after %d came and went", n, 10*minSweep)
	}
	if l.Running(alice) != 1 {
		t.Error("the sweep dropped a caller with a running job")
	}
	release()
}

// TestStoreLimits: Store.Allow and Acquire use the policy in force.
func TestStoreLimits(t *testing.T) {
	s, path, _ := newTestStore(t, "version: 1\nidentities:\n  nats:alice:\n    limits: {max_concurrent_jobs: 1}\n")
	rel, err := s.Acquire(alice, OpExec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(alice, OpExec); err == nil {
		t.Fatal("2nd job allowed at max_concurrent_jobs 1")
	}
	writeFile(t, path, "version: 1\nidentities:\n  nats:alice:\n    limits: {max_concurrent_jobs: 2}\n")
	if _, err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	rel2, err := s.Acquire(alice, OpExec)
	if err != nil {
		t.Fatalf("2nd job refused after raising the limit: %v", err)
	}
	rel()
	rel2()
	if err := s.Allow(alice, OpExec); err != nil {
		t.Error(err)
	}
}

// TestCheckThenApply: Check changes nothing; Apply puts in force the
// policy Check read, whatever the file holds by then; Keep counts a
// reload that kept the policy in force.
func TestCheckThenApply(t *testing.T) {
	s, path, reg := newTestStore(t, stagingOnly)
	before := s.Policy()
	writeFile(t, path, prodToo)
	p, err := s.Check()
	if err != nil {
		t.Fatal(err)
	}
	if s.Policy() != before {
		t.Fatal("Check put the policy in force")
	}
	writeFile(t, path, "not: [a policy\n") // edited after the check
	s.Apply(p)
	if s.Policy() != p {
		t.Fatal("Apply did not put the checked policy in force")
	}
	if _, err := s.Decide(alice, OpExec, nodeB, Object{}); err != nil {
		t.Fatalf("exec on prod refused under the checked policy: %v", err)
	}
	s.Keep()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tether_policy_reloads_total Policy reloads, by result (error: the old policy was kept).
# TYPE tether_policy_reloads_total counter
tether_policy_reloads_total{result="error"} 1
tether_policy_reloads_total{result="ok"} 1
`), "tether_policy_reloads_total"); err != nil {
		t.Error(err)
	}
}
