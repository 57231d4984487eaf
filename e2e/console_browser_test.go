//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The web console in a real headless browser (Debian's chromium), against
// a real coordinator and agent: the browser signs in with a console token
// (the login exchange's cookie), the nodes page shows the node and its
// labels, and a detached job's page shows output that arrived after the
// page loaded (the page's script fetched it). Without chromium on PATH
// (or $TETHER_CHROMIUM) the test skips, loudly; with
// TETHER_REQUIRE_BROWSER=1 (the CI block of .ci/run) it fails instead.

// chromiumBin finds the browser, or skips or fails the test.
func chromiumBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TETHER_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("TETHER_REQUIRE_BROWSER") == "1" {
		t.Fatal("TETHER_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium, or set TETHER_CHROMIUM)")
	}
	t.Skip("SKIPPED: the console's browser test needs chromium (apt-get install chromium); set TETHER_REQUIRE_BROWSER=1 to make this a failure")
	return ""
}

// dumpDOM loads url in a fresh headless chromium profile and returns the
// DOM once the page is loaded and its script idle: virtual time runs
// budget ahead, and stands still while a request is in flight (a long
// poll of the output endpoint holds it).
func dumpDOM(ctx context.Context, t *testing.T, bin, url string, budget time.Duration) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(),
		fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds()), "--dump-dom", url)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("chromium %s: %v; stderr:\n%s", url, err, errb.String())
	}
	return out.String(), nil
}

func TestConsoleBrowser(t *testing.T) {
	bin := chromiumBin(t)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	// nats:e2e (the test's CLI) runs the job; token:browser may only read.
	// The test's own uid is not named: its plain requests are refused.
	pol := `version: 1
identities:
  nats:e2e:
    rules:
      - nodes: "*"
        operations: [exec, job.status, job.logs, nodes.list]
        run_as: ` + u.Username + `
  token:browser:
    rules:
      - nodes: "*"
        operations: [nodes.list]
      - nodes: "*"
        operations: [job.status, job.logs]
        scope: any
      - operations: [sandboxes.list]
        scope: any
      - operations: [admin]
`
	dir := t.TempDir()
	polPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polPath, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "browser-console-token-0123456789abcdef"
	tokPath := filepath.Join(dir, "console-tokens")
	if err := os.WriteFile(tokPath, []byte("# console tokens\nbrowser "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startFleetArgs(t, polPath, "--console-token-file", tokPath)
	f.startAgent(t, "console-node", "role=browser-test,zone=z1", f.tokenFile)
	f.waitNodes(t, "console-node")
	base := "http://" + f.httpAddr

	// Refusals through the real admin listener.
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"no credentials (a loopback uid the policy does not name)", "", http.StatusForbidden},
		{"a wrong bearer token", "Bearer not-the-console-token-0123456789", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("GET", base+"/console/nodes", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: GET /console/nodes %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	login := func(next string) string {
		return base + "/console/login?token=" + url.QueryEscape(token) + "&next=" + url.QueryEscape(next)
	}

	// The nodes page, signed in through the login exchange.
	dom, err := dumpDOM(ctx, t, bin, login("/console/nodes"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-node="console-node"`, "role=browser-test", "zone=z1", "token:browser"} {
		if !strings.Contains(dom, want) {
			t.Fatalf("the nodes page in chromium lacks %q; DOM:\n%s", want, dom)
		}
	}

	// A detached job that prints one line, then a second once the test
	// opens the gate: after the browser loaded the page.
	gate := filepath.Join(dir, "gate")
	stdout, stderr, code := runCLI(t, f.natsURL, "", "exec", "--node", "console-node", "--detach", "--",
		"sh", "-c", "echo first-line-from-job; while [ ! -f "+gate+" ]; do sleep 0.1; done; echo second-line-from-job")
	if code != 0 {
		t.Fatalf("exec --detach: exit %d: %s", code, stderr)
	}
	jobID := strings.TrimSpace(stdout)
	if !regexp.MustCompile(`^[A-Za-z0-9._-]+$`).MatchString(jobID) {
		t.Fatalf("exec --detach printed %q, want a job id", stdout)
	}
	const jobStreams = `tether_coordinator_streams_opened_total{kind="job"}`
	before := metric(t, f.httpAddr, jobStreams)
	type result struct {
		dom string
		err error
	}
	done := make(chan result, 1)
	go func() {
		dom, err := dumpDOM(ctx, t, bin, login("/console/jobs/"+jobID), 60*time.Second)
		done <- result{dom, err}
	}()
	// The page's first render reads stdout and stderr (two job streams);
	// its script's first poll opens a third. Then the second line may come.
	checkFor(t, 2*time.Minute, func() error {
		if n := metric(t, f.httpAddr, jobStreams); n < before+3 {
			return fmt.Errorf("%v job streams since the browser started, want 3 (the page and its first poll)", n-before)
		}
		return nil
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("chromium did not finish")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	dom = res.dom
	m := regexp.MustCompile(`(?s)<pre class="output" id="out-console-node-stdout"[^>]*data-eof="(\w+)"[^>]*>(.*?)</pre>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no stdout output on the job's page; DOM:\n%s", dom)
	}
	if m[1] != "true" || !strings.Contains(m[2], "first-line-from-job") || !strings.Contains(m[2], "second-line-from-job") {
		t.Fatalf("the job's stdout in chromium: eof %s, text %q; want both lines and the end (the second came after the page loaded, through the script)", m[1], m[2])
	}
	// The state was rendered with the page, before the gate opened.
	if !strings.Contains(dom, `id="job-state">running<`) {
		t.Errorf("the job's page was rendered after the job ended, so it does not show the script's live output; DOM:\n%s", dom)
	}
	t.Logf("chromium showed job %s's live output through the console", jobID)
}
