package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

func TestSecondsDurationFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "1.5": 1500 * time.Millisecond, "2m": 2 * time.Minute, "-1": -time.Second} {
		var d time.Duration
		if err := (durationFlag{d: &d}).Set(in); err != nil || d != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, d, err, want)
		}
	}
	var d time.Duration
	if err := (durationFlag{d: &d}).Set("soon"); err == nil {
		t.Error("Set(soon) succeeded")
	}
}

func TestInterruptCode(t *testing.T) {
	for _, tt := range []struct {
		cause error
		want  int
	}{
		{SignalCause(syscall.SIGTERM), 143},
		{SignalCause(syscall.SIGINT), 130},
		{SignalCause(syscall.SIGHUP), 129},
		{SignalCause(syscall.SIGPIPE), 141},
		{nil, 130},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(tt.cause)
		if got := interruptCode(ctx); got != tt.want {
			t.Errorf("cause %v: code %d, want %d", tt.cause, got, tt.want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	var term syncBuffer
	p := newProgress(&term, 1000, 64)
	for i := range 12 {
		p.nodeDone(i%4 != 0)
	}
	if got, want := p.line(), "12/1000 done · 3 failed · 64 running"; got != want {
		t.Errorf("line = %q, want %q", got, want)
	}
	p.mu.Lock()
	p.drawLocked()
	p.mu.Unlock()
	// An output line clears the progress line first, then the ticker
	// redraws it.
	p.writer(&term).Write([]byte("node-1 | hello\n"))
	if got, want := term.String(), "\r\033[K12/1000 done · 3 failed · 64 running\r\033[Knode-1 | hello\n"; got != want {
		t.Errorf("terminal = %q, want %q", got, want)
	}
	p.start()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.HasSuffix(term.String(), "running") {
		if time.Now().After(deadline) {
			t.Fatal("progress line not redrawn")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.stop()
	if !strings.HasSuffix(term.String(), "\r\033[K") {
		t.Errorf("progress line not cleared at the end: %q", term.String())
	}
}

func TestWriteSummary(t *testing.T) {
	res := &protocol.ExecResult{Results: []protocol.NodeResult{
		{Node: "a", DurationMS: 10},
		{Node: "b", ExitCode: 2, DurationMS: 1500, Failure: "Command failed (exec on b) with exit code 2:\n  bash -s\nboom"},
		{Node: "c", ExitCode: -1, Error: "tunnel lost during exec: EOF"},
		{Node: "d", DurationMS: 20, StdoutTruncated: true},
		{Node: "e", ExitCode: -1, ErrorCode: protocol.CodeCommandNotFound, Error: "nosuch: command not found"},
	}}
	var w bytes.Buffer
	if err := writeSummary(&w, res, 0, false, 2*time.Second, exitInterrupted); err != nil {
		t.Fatal(err)
	}
	want := "NODE  EXIT  DURATION  RESULT\n" +
		"b     2     1.5s      exit 2: bash -s: boom\n" +
		"c     255   0s        tunnel lost during exec: EOF\n" +
		"d     0     20ms      ok, output truncated\n" +
		"e     127   0s        nosuch: command not found (command_not_found)\n" +
		"5 nodes: 2 succeeded, 3 failed, 1 with output truncated (2s)\n"
	if w.String() != want {
		t.Errorf("summary =\n%s\nwant\n%s", w.String(), want)
	}
	w.Reset()
	writeSummary(&w, res, 0, true, time.Second, exitInterrupted)
	if !strings.Contains(w.String(), "\na     0     10ms      ok\n") {
		t.Errorf("--summary table lacks the ok node:\n%s", w.String())
	}
	// A detached fan-out's nodes started the job; none has succeeded yet.
	w.Reset()
	det := &protocol.ExecResult{Results: []protocol.NodeResult{{Node: "a", Detached: true}, {Node: "b", Detached: true}, {Node: "c", ExitCode: -1, Error: "tunnel lost"}}}
	writeSummary(&w, det, 0, false, time.Second, exitInterrupted)
	if !strings.HasSuffix(w.String(), "3 nodes: 2 started, 1 failed (1s)\n") {
		t.Errorf("detached summary:\n%s", w.String())
	}
}

// The exec and job commands against an in-process fleet.
func TestExecAndJobCommandsOnFleet(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 3, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)

	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "-c", "echo a", "-c", "echo oops >&2; exit 3", "-c", "echo b", "--fail-fast")
	// Its stderr is printed once: streamed, then not again after the
	// failure line.
	if r.code != 3 || r.stdout != "a\n" || r.stderr != "oops\nCommand failed (exec on node-0) with exit code 3:\n  echo oops >&2; exit 3\n" {
		t.Errorf("fail-fast: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Several nodes: each node's stderr once (streamed), not again in its
	// failure line nor in the summary table.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--", "sh", "-c", "echo ${0}-err >&2; exit 2", "uniq")
	if r.code != 1 || strings.Count(r.stderr, "uniq-err") != 3 || strings.Count(r.stderr, "Command failed") != 3 {
		t.Errorf("fan-out failure: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "-c", "false", "-c", "echo a")
	if r.code != 0 || r.stdout != "a\n" {
		t.Errorf("batch as a script: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--timeout", "1", "--", "sleep", "10")
	if r.code != exitTimedOut || !strings.Contains(r.stderr, "timed out after 1s") {
		t.Errorf("--timeout 1: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--cwd", "/nonexistent", "--", "true")
	if r.code != 255 || !strings.Contains(r.stderr, "tether: node node-0: cwd /nonexistent: no such file or directory (start_failed)") || strings.Count(r.stderr, "node-0") != 1 {
		t.Errorf("bad cwd: exit %d, stderr %q", r.code, r.stderr)
	}

	// Fan-out: a table of the failed nodes and the totals.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--", "sh", "-c", `echo hi; [ "$(pwd)" = / ] || test "${PWD##*/}" != x; case $TETHER_N in *) exit 0;; esac`)
	if r.code != 0 || !strings.Contains(r.stderr, "3 nodes: 3 succeeded, 0 failed") || strings.Contains(r.stderr, "NODE") {
		t.Errorf("fan-out ok: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--summary", "-c", "exit 5")
	if r.code != 1 || !regexp.MustCompile(`(?m)^node-1 +5 +\S+ +exit 5: bash -s$`).MatchString(r.stderr) ||
		!strings.Contains(r.stderr, "3 nodes: 0 succeeded, 3 failed") {
		t.Errorf("fan-out failed: exit %d, stderr %q", r.code, r.stderr)
	}

	// --json: chunks, node results, then the result.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--selector", "index in (0,2)", "--json", "--", "echo", "x")
	var chunks, nodeResults int
	var last map[string]any
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("--json line %q: %v", line, err)
		}
		switch {
		case m["stream"] != nil:
			chunks++
		case m["node_result"] != nil:
			nodeResults++
		}
		last = m
	}
	if r.code != 0 || chunks != 2 || nodeResults != 2 || last["results"] == nil {
		t.Errorf("--json: exit %d, %d chunks, %d node results, last %v\n%s", r.code, chunks, nodeResults, last, r.stdout)
	}

	// Detached job and the job commands.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-2", "--detach", "-c", "echo out", "-c", "echo err >&2", "-c", "sleep 0.3")
	m := regexp.MustCompile(`job (\S+) started detached on node node-2`).FindStringSubmatch(r.stderr)
	if r.code != 0 || m == nil {
		t.Fatalf("--detach: exit %d, stderr %q", r.code, r.stderr)
	}
	id := m[1]
	if r.stdout != id+"\n" {
		t.Errorf("--detach: stdout %q, want the job id alone", r.stdout)
	}
	r = runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, "--node", "node-2", "--follow", "--poll", "50ms", id)
	if r.code != 0 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("job logs --follow: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, "--node", "node-2", id)
	if r.code != 0 || !strings.Contains(r.stdout, "state:     succeeded") || !strings.Contains(r.stdout, "exit:      0") {
		t.Errorf("job status: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// --follow ends with the job's own exit code.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-2", "--detach", "--", "sh", "-c", "exit 6")
	id6 := regexp.MustCompile(`job (\S+) started`).FindStringSubmatch(r.stderr)[1]
	r = runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, "--node", "node-2", "--follow", "--poll", "50ms", id6)
	if r.code != 6 {
		t.Errorf("job logs --follow of a job that exited 6: exit %d, stderr %q", r.code, r.stderr)
	}
	// Without --node: the node is looked up in the job store by id.
	r = runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", id6)
	if r.code != 6 {
		t.Errorf("job wait of a job that exited 6: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, id6)
	if r.code != 0 || !strings.Contains(r.stdout, "node:      node-2 exit 6") || !strings.Contains(r.stdout, "exit:      6") {
		t.Errorf("job status without --node: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// An unknown id is said once, in one line with one prefix.
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, "nosuchjob")
	if r.code != 255 || strings.Count(r.stderr, "tether:") != 1 || !strings.Contains(r.stderr, `no job "nosuchjob"`) {
		t.Errorf("job status of an unknown id: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, id)
	if r.code != 0 || r.stdout != "out\n" {
		t.Errorf("job logs without --node: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// An attached job's record: wait returns its exit code.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-1", "--json", "--", "sh", "-c", "exit 7")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var res protocol.ExecResult
	if r.code != 7 || json.Unmarshal([]byte(lines[len(lines)-1]), &res) != nil || res.ID == "" {
		t.Fatalf("attached exec exit 7: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	attached := res.ID
	r = runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", attached)
	if r.code != 7 {
		t.Errorf("job wait of an attached job that exited 7: exit %d, stderr %q", r.code, r.stderr)
	}
	// Its logs were never kept: said so, not "no detached job".
	r = runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, attached)
	if r.code == 0 || !strings.Contains(r.stderr, "was attached") || strings.Contains(r.stderr, "no detached job") {
		t.Errorf("job logs of an attached job: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--state", "failed")
	if r.code != 0 || !strings.Contains(r.stdout, id6) || !strings.Contains(r.stdout, attached) || strings.Contains(r.stdout, id+" ") {
		t.Errorf("job list --state failed: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-2", "--detach", "--", "sleep", "60")
	id = regexp.MustCompile(`job (\S+) started`).FindStringSubmatch(r.stderr)[1]
	r = runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--node", "node-2", "--json", id)
	var st protocol.JobRecord
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || len(st.Results) != 1 || !st.Results[0].Cancelled || st.State != protocol.JobCancelled {
		t.Errorf("job cancel: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A second cancel: the job had ended; said so, exit 0 (F8 of fresh2).
	r = runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--node", "node-2", id)
	if r.code != 0 || !strings.Contains(r.stderr, "job "+id+" had already ended (cancelled): nothing to cancel") || !strings.Contains(r.stdout, "state:     cancelled") {
		t.Errorf("job cancel of an ended job: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, "--node", "node-2", "nope")
	if r.code != 255 || !strings.Contains(r.stderr, "not_found") {
		t.Errorf("unknown job: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestParseSizeTooLarge: a whole number past int64 is named too large,
// not "not a whole number".
func TestParseSizeTooLarge(t *testing.T) {
	for _, in := range []string{"99999999999999999999", "99999999999999999999K"} {
		if _, err := parseSize(in); err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("parseSize(%q) = %v, want too large", in, err)
		}
	}
	if _, err := parseSize("-99999999999999999999"); err == nil || strings.Contains(err.Error(), "too large") {
		t.Errorf("a negative number: %v", err)
	}
}

// TestFanOutSummaryAfterSignal: the fan-out table's EXIT column is the
// code `--node` would exit with, so a node cancelled by the client's
// SIGTERM shows 143, the code the process exits with, and one cancelled by
// SIGINT 130 (issue 13's fresh-user pass, F11: the table said 130 after
// SIGTERM).
func TestFanOutSummaryAfterSignal(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2})
	url := f.NATS.ClientURL()
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGTERM, exitTerminated}, {syscall.SIGINT, exitInterrupted}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(testCtx(t))
			defer cancel(nil)
			var stdout, stderr syncBuffer
			e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"exec", "--nats-url", url, "--all", "-n", "--", "sh", "-c", "echo started; exec sleep 60"}, e)
			}()
			checkFor(t, defaultTestTimeout, func() error {
				if n := strings.Count(stdout.String(), "started"); n < 2 {
					return fmt.Errorf("%d of 2 nodes started; stdout %q", n, stdout.String())
				}
				return nil
			})
			cancel(SignalCause(tc.sig))
			code := <-done
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr.String())
			}
			for _, node := range []string{"node-0", "node-1"} {
				row := regexp.MustCompile(`(?m)^` + node + ` +(\d+) `).FindStringSubmatch(stderr.String())
				if row == nil || row[1] != strconv.Itoa(tc.code) {
					t.Errorf("summary row of %s: %q, want EXIT %d (the process's code); stderr:\n%s", node, row, tc.code, stderr.String())
				}
			}
		})
	}
}
