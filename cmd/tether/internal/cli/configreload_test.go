package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/protocol"
)

// TestCoordinatorConfigReload: with an agent connected and a stream open
// through it, SIGHUP re-reads the config file: the changed limits apply
// (a job without a timeout of its own gets the new exec-timeout; the
// per-source handshake bound is the new one), a changed listener refuses
// the reload, naming the key, and the agent's session and the stream stay up.
// A broken file keeps everything in force.
func TestCoordinatorConfigReload(t *testing.T) {
	dir := t.TempDir()
	policyFile := writeTestPolicy(t, testAdminPolicy(t))
	base := fmt.Sprintf("role: coordinator\npolicy: %s\nlisten: 127.0.0.1:0\nhttp-addr: 127.0.0.1:0\nnats-listen: 127.0.0.1:0\nopenshell-listen: 127.0.0.1:0\nopensandbox-listen: 127.0.0.1:0\nallow-shared-token: true\n", policyFile)
	path := writeConfig(t, base+"max-handshakes-per-source: 4\n")

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	o := defaultCoordinatorOptions()
	e := testEnv(nil)
	cmd := coordinatorCommand(e, &o)
	// --data-dir on the command line: a re-read keeps it over the file.
	if err := cmd.ParseFlags([]string{"--config", path, "--data-dir", dir}); err != nil {
		t.Fatal(err)
	}
	src, err := loadDaemonConfig(cmd, e, coordinatorConfigRole, &o.Log)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	f := startReloadFleet(t, o, src, log, "node-cfg")
	cs, cl := f.cs, f.cl
	if got := cs.coord.Limits().MaxHandshakesPerSource; got != 4 {
		t.Fatalf("max handshakes per source at start = %d, want the file's 4", got)
	}
	f.echo(t, "before\n")
	hup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// The limits change, and so does a listener, which cannot at run
	// time: the reload is refused, naming it, and the limits stay.
	limits := cs.coord.Limits()
	replaceFile(t, path, strings.Replace(base, "listen: 127.0.0.1:0\n", "listen: 127.0.0.1:1\n", 1)+
		"max-handshakes-per-source: 2\nexec-timeout: 1s\nadmit-rate: 77\ndata-dir: /elsewhere\n")
	hup()
	waitFor(t, func() error {
		if !strings.Contains(logs.String(), path+":3: key listen: cannot change at run time; restart the coordinator") {
			return errors.New("no reload failure naming the changed listen key yet")
		}
		return nil
	})
	if l := cs.coord.Limits(); l != limits {
		t.Errorf("limits after a refused reload: %+v, want the ones in force %+v", l, limits)
	}
	if strings.Contains(logs.String(), "key data-dir") {
		t.Errorf("the file's data-dir was taken over the command line's --data-dir:\n%s", logs.String())
	}
	// The listener set back: the limits apply.
	replaceFile(t, path, base+"max-handshakes-per-source: 2\nexec-timeout: 1s\nadmit-rate: 77\ndata-dir: /elsewhere\n")
	hup()
	waitFor(t, func() error {
		if l := cs.coord.Limits(); l.MaxHandshakesPerSource != 2 || l.DefaultTimeout.Seconds() != 1 || l.AdmitRate != 77 {
			return fmt.Errorf("limits after SIGHUP: %+v", l)
		}
		return nil
	})
	res, err := cl.Exec(testCtx(t), &protocol.ExecRequest{Target: protocol.Target{Node: "node-cfg"}, Argv: []string{"sleep", "30"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 1 || !res.Results[0].TimedOut {
		t.Fatalf("a job without a timeout after the reload: %+v, want timed out by the new exec-timeout (1s)", res.Results)
	}
	f.echo(t, "after\n")
	f.sameSession(t)

	// A broken file: nothing changes, the log names the line.
	replaceFile(t, path, base+"max-handshakes-per-source: 9\nexec-timeout: soon\n")
	hup()
	waitFor(t, func() error {
		if !strings.Contains(logs.String(), path+":10: key exec-timeout") {
			return errors.New("no reload failure naming " + path + ":10 logged yet")
		}
		return nil
	})
	if l := cs.coord.Limits(); l.MaxHandshakesPerSource != 2 || l.DefaultTimeout.Seconds() != 1 || l.AdmitRate != 77 {
		t.Fatalf("limits after a broken reload: %+v, want the ones in force (2, 1s, 77/s)", l)
	}
	f.echo(t, "still\n")
	f.sameSession(t)
	f.st.CloseWrite()
}

// TestAgentConfigReload: SIGHUP re-reads the agent's config file: a new
// local-policy file is loaded; a changed node id is only logged, naming
// the key; a broken file keeps the policy in force.
func TestAgentConfigReload(t *testing.T) {
	pdir := t.TempDir()
	first, second := filepath.Join(pdir, "first.yaml"), filepath.Join(pdir, "second.yaml")
	for f, doc := range map[string]string{first: "version: 1\nexec: false\n", second: "version: 1\nexec: true\n"} {
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := "role: agent\ncoordinator: [127.0.0.1:1]\ntoken-file: /nonexistent/token\ndata-dir: " + t.TempDir() + "\n"
	path := writeConfig(t, base+"node-id: one\nlocal-policy: "+first+"\n")
	o, src := loadAgentConfig(t, path, nil)
	p, lpPath, err := loadLocalPolicy(o.LocalPolicy)
	if err != nil || lpPath != first {
		t.Fatalf("local policy: %v %q", err, lpPath)
	}
	cfg := agent.DefaultConfig()
	cfg.Coordinators, cfg.Token, cfg.Dial = o.Coordinators, "t", nil
	cfg.TLS = &tls.Config{}
	cfg.LocalPolicy = p
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	stop := watchAgentReload(testCtx(t), a, lpPath, o.LocalPolicy, src, nil, slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil)))
	defer stop()
	hup := func() { syscall.Kill(os.Getpid(), syscall.SIGHUP) }
	if a.LocalPolicy().AllowExec() == nil {
		t.Fatal("exec allowed under the first policy")
	}

	replaceFile(t, path, base+"node-id: two\nlocal-policy: "+second+"\n")
	hup()
	checkFor(t, defaultTestTimeout, func() error {
		if a.LocalPolicy().AllowExec() != nil {
			return errorString("exec still refused after SIGHUP named the second policy")
		}
		return nil
	})
	checkFor(t, defaultTestTimeout, func() error {
		if !strings.Contains(logs.String(), "key=node-id") {
			return errorString("no warning naming node-id")
		}
		return nil
	})

	// Broken: the policy in force stays, also when the file names the
	// first policy again.
	replaceFile(t, path, base+"node-id: two\nlocal-policy: "+first+"\nlocal-polcy: x\n")
	hup()
	checkFor(t, defaultTestTimeout, func() error {
		if !strings.Contains(logs.String(), "config reload failed") {
			return errorString("no reload failure logged")
		}
		return nil
	})
	if !strings.Contains(logs.String(), "did you mean local-policy?") {
		t.Errorf("the failure does not suggest local-policy:\n%s", logs.String())
	}
	if a.LocalPolicy().AllowExec() != nil {
		t.Fatal("a broken config file changed the local policy")
	}
}

// A re-read changes the running logger's level; the format waits for a
// restart.
func TestConfigReloadLogLevel(t *testing.T) {
	path := writeConfig(t, "coordinator: [c:7443]\ntoken-file: /t\nlog-level: info\n")
	o, src := loadAgentConfig(t, path, nil)
	var logs syncBuffer
	log := o.Log.logger(&logs)
	log.Debug("before")
	replaceFile(t, path, "coordinator: [c:7443]\ntoken-file: /t\nlog-level: debug\nlog-format: json\n")
	_, _, live, fixed, err := src.reread()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := reloadStatus(live, fixed), "config reloaded: applied log-level; 1 changed key(s) wait for a restart: log-format"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
	if rest := src.applyLogLevel(live); len(rest) != 0 {
		t.Fatalf("changes other than log-level applied: %+v", rest)
	}
	if len(fixed) != 1 || fixed[0].key != "log-format" {
		t.Fatalf("fixed changes = %+v, want log-format", fixed)
	}
	log.Debug("after")
	if strings.Contains(logs.String(), "before") || !strings.Contains(logs.String(), "after") {
		t.Fatalf("logs:\n%s\nwant the debug line after the re-read only", logs.String())
	}
	// Committed: a second re-read finds log-level unchanged.
	if _, _, live, _, err := src.reread(); err != nil || len(live) != 0 {
		t.Fatalf("second re-read: %v, live %+v", err, live)
	}
}

// TestCoordinatorReloadLimitRefusalNamesKey: a re-read value that the
// running coordinator refuses (admit-rate turning handshake pacing on,
// which was off at start) is reported as load-time errors are: the file,
// the key's line and the key as written, not the Go field (AdmitRate);
// the limits in force stay.
func TestCoordinatorReloadLimitRefusalNamesKey(t *testing.T) {
	policyFile := writeTestPolicy(t, testAdminPolicy(t))
	base := fmt.Sprintf("role: coordinator\npolicy: %s\nlisten: 127.0.0.1:0\nhttp-addr: 127.0.0.1:0\nnats-listen: 127.0.0.1:0\nopenshell-listen: \"\"\nopensandbox-listen: \"\"\nallow-shared-token: true\ndata-dir: %s\n", policyFile, t.TempDir())
	path := writeConfig(t, base+"admit-rate: -1\n")
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	o := defaultCoordinatorOptions()
	e := testEnv(nil)
	cmd := coordinatorCommand(e, &o)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	src, err := loadDaemonConfig(cmd, e, coordinatorConfigRole, &o.Log)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	cs.config = src

	for _, tc := range []struct{ file, want string }{
		{base + "exec-timeout: 5s\nadmit-rate: 50\n", path + ":11: key admit-rate: 50 would turn handshake pacing on"},
		{base + "exec-timeout: 5s\n", path + ": key admit-rate (not set: 0) would turn handshake pacing on"},
	} {
		replaceFile(t, path, tc.file)
		status := cs.reload()
		for _, out := range []string{status, logs.String()} {
			if !strings.Contains(out, tc.want) || strings.Contains(out, "AdmitRate") {
				t.Errorf("reload refused by the limits says:\n%s\nwant %q, not the Go field AdmitRate", out, tc.want)
			}
		}
		if l := cs.coord.Limits(); l.AdmitRate >= 0 || l.DefaultTimeout != 0 {
			t.Errorf("limits after a refused reload: %+v, want the ones in force (pacing off, no timeout)", l)
		}
	}
}

// TestCoordinatorReloadAllOrNothing: a SIGHUP whose config file is
// refused reloads nothing, the policy included (it was reloaded anyway
// before), and says so; a policy file that is refused keeps the config
// file's changes out as well.
func TestCoordinatorReloadAllOrNothing(t *testing.T) {
	policyFile := writeTestPolicy(t, testAdminPolicy(t))
	base := fmt.Sprintf("role: coordinator\npolicy: %s\nlisten: 127.0.0.1:0\nhttp-addr: 127.0.0.1:0\nnats-listen: 127.0.0.1:0\nopenshell-listen: \"\"\nopensandbox-listen: \"\"\nallow-shared-token: true\ndata-dir: %s\n", policyFile, t.TempDir())
	path := writeConfig(t, base)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	o := defaultCoordinatorOptions()
	e := testEnv(nil)
	cmd := coordinatorCommand(e, &o)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	src, err := loadDaemonConfig(cmd, e, coordinatorConfigRole, &o.Log)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	cs.config = src
	before := cs.policy.Policy()

	// A bad config file, a good new policy: neither applies.
	replaceFile(t, policyFile, testAdminPolicy(t)+"\n# changed\n")
	replaceFile(t, path, base+"heartbeat: true\nmax-handshakes-per-source: -3\n")
	status := cs.reload()
	// Every problem at once, in the file's terms (F2, F3 of fresh2).
	for _, w := range []string{path + ":10: key heartbeat: want a duration", path + ":11: key max-handshakes-per-source: -3 is negative: want 0 or more"} {
		if !strings.Contains(status, w) {
			t.Errorf("status %q\nwant %q", status, w)
		}
	}
	if cs.policy.Policy() != before {
		t.Errorf("a refused config file reloaded the policy; status %q", status)
	}
	if strings.Contains(logs.String(), "policy reloaded") || !strings.Contains(status, "nothing changed") {
		t.Errorf("status %q, logs:\n%s\nwant no policy reloaded and 'nothing changed'", status, logs.String())
	}

	// A good config file, a bad policy: the limits stay too.
	replaceFile(t, policyFile, "not: [a policy\n")
	replaceFile(t, path, base+"max-handshakes-per-source: 3\n")
	status = cs.reload()
	if l := cs.coord.Limits(); l.MaxHandshakesPerSource == 3 {
		t.Errorf("a refused policy let the config's limits apply: %+v; status %q", l, status)
	}
	if cs.policy.Policy() != before || !strings.Contains(status, "nothing changed") {
		t.Errorf("status %q; policy changed: %v", status, cs.policy.Policy() != before)
	}
}
