//go:build e2e && sshbench

package e2e

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"text/tabwriter"
	"time"
)

var clientBin = flag.String("tether-client-bin", "", "make bench-startup: the client-only build (-tags tetherclient) to measure beside -tether-bin (default: build one)")

// TestStartupBenchmark measures whole processes, as a user's shell runs
// them (issue 12, item 4): `tether version` against /bin/true, and
// `tether exec --node node-a -- true` against `ssh host true` through an
// OpenSSH ControlMaster to a loopback sshd, for the full build and for the
// client-only build (-tether-client-bin; built with -tags tetherclient
// when not given). Every side runs
// STARTBENCH_RUNS (default 30) times in a row per round, for
// STARTBENCH_ROUNDS (default 7) rounds, the order of the sides reversed
// every other round; it prints each side's median per-run time and the
// median of the per-round ratios, of wall time and of CPU time (the
// processes' user + system time, from their rusage: much steadier than wall
// time on a loaded, shared machine, and what start-up work costs).
// It also prints the client build's ratios to the full build's.
// -tether-base-bin adds another build beside (its ratios to the current
// one too). Run it with
// `make bench-startup`. Nothing is asserted: a loaded machine moves the
// numbers, the targets (≤ 3 ms, ≤ 0.33× ssh) are for an idle one.
func TestStartupBenchmark(t *testing.T) {
	needTools(t, "ssh", "ssh-keygen", "sshd")
	if raceBuilt(t, *tetherBin) {
		plain := plainBinary(t)
		t.Logf("%s is built with -race; benchmarking %s instead", *tetherBin, plain)
		old := *tetherBin
		*tetherBin = plain
		t.Cleanup(func() { *tetherBin = old })
	}
	rounds := envInt(t, "STARTBENCH_ROUNDS", 7)
	runs := envInt(t, "STARTBENCH_RUNS", 30)

	dir := t.TempDir()
	key := newSSHKey(t, dir, "bench")
	sshd := startSSHD(t, key, nestedShell)
	sock := filepath.Join(dir, "cm")
	mustRun(t, "ssh", "-F", sshd.Config, "-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-o", "ControlPath="+sock, "-N", sshd.Host)
	// Every run below must reuse this master: without it, each would be a
	// full handshake and the comparison would flatter tether.
	mustRun(t, "ssh", "-F", sshd.Config, "-o", "ControlPath="+sock, "-O", "check", sshd.Host)
	t.Cleanup(func() {
		exec.Command("ssh", "-F", sshd.Config, "-o", "ControlPath="+sock, "-O", "exit", sshd.Host).Run()
	})

	f := startFleet(t)
	f.startAgent(t, "node-a", "role=a", f.tokenFile)
	f.waitNodes(t, "node-a")
	clientEnv := append(os.Environ(), natsEnv(f.natsURL)...)

	type side struct {
		name string
		argv []string
		env  []string
	}
	tetherSides := func(bin, label string) []side {
		return []side{
			{name: label + " version", argv: []string{bin, "version"}},
			{name: label + " exec --node node-a -- true", argv: []string{bin, "exec", "--node", "node-a", "--", "true"}, env: clientEnv},
		}
	}
	sides := []side{
		{name: "/bin/true", argv: []string{"/bin/true"}},
		{name: "ssh true via ControlMaster", argv: []string{"ssh", "-F", sshd.Config, "-o", "ControlMaster=no", "-o", "ControlPath=" + sock, sshd.Host, "true"}},
	}
	// The fleet above runs *tetherBin itself; the sides run copies. A
	// binary just written by the linker (through a memory mapping) starts
	// up to 1.3x slower than a copy of it written with write(2), with the
	// same page faults (seen on this machine), and only the current build
	// is fresh: copying both puts them on equal terms, as installed
	// binaries are.
	client := *clientBin
	if client == "" {
		client = filepath.Join(dir, "tether-client-built")
		if out, err := exec.Command("go", "build", "-tags", "tetherclient", "-o", client, "../cmd/tether").CombinedOutput(); err != nil {
			t.Fatalf("build the client-only tether: %v: %s", err, out)
		}
	}
	const full, clientAt = 2, 4 // the first side of each build
	sides = append(sides, tetherSides(copyBinary(t, *tetherBin, filepath.Join(dir, "tether")), "tether")...)
	sides = append(sides, tetherSides(copyBinary(t, client, filepath.Join(dir, "tether-client")), "tether-client")...)
	baseAt := len(sides)
	if *baseBin != "" {
		sides = append(sides, tetherSides(copyBinary(t, *baseBin, filepath.Join(dir, "tether-base")), "base")...)
	}
	// One run of each first: a side that fails stops the benchmark here,
	// and the page cache holds every binary before the first round.
	for _, s := range sides {
		if _, out, err := runOnce(s.argv, s.env); err != nil {
			t.Fatalf("%s: %v: %s", s.name, err, out)
		}
	}
	per := make([][]float64, len(sides)) // [side][round] seconds per run
	cpu := make([][]float64, len(sides)) // [side][round] CPU seconds per run
	for r := range rounds {
		order := make([]int, len(sides))
		for i := range order {
			order[i] = i
			if r%2 == 1 {
				order[i] = len(sides) - 1 - i
			}
		}
		for _, i := range order {
			s := sides[i]
			start := time.Now()
			var used time.Duration
			for range runs {
				c, out, err := runOnce(s.argv, s.env)
				if err != nil {
					t.Fatalf("round %d, %s: %v: %s", r, s.name, err, out)
				}
				used += c
			}
			per[i] = append(per[i], time.Since(start).Seconds()/float64(runs))
			cpu[i] = append(cpu[i], used.Seconds()/float64(runs))
		}
	}
	ratioOf := func(m [][]float64, a, b int) []float64 {
		var v []float64
		for r := range rounds {
			v = append(v, m[a][r]/m[b][r])
		}
		return v
	}
	ratio := func(a, b int) []float64 { return ratioOf(per, a, b) }
	var out bytes.Buffer
	fmt.Fprintf(&out, "start-up benchmark: %d interleaved rounds of %d runs per side, %d cores, load %s, %s\n",
		rounds, runs, runtime.NumCPU(), loadAvg(), sshVersion(t))
	tw := tabwriter.NewWriter(&out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "side\tmedian per run\tratio (median of rounds; each round)\ttarget\tCPU per run\tCPU ratio (median; each round)")
	for i, s := range sides {
		line := fmt.Sprintf("%s\t%.3f ms", s.name, median(per[i])*1e3)
		cpuLine := fmt.Sprintf("\t\t\t%.3f ms", median(cpu[i])*1e3)
		switch {
		case i >= 2 && (i-2)%2 == 0: // version: to /bin/true
			rs, cs := ratio(i, 0), ratioOf(cpu, i, 0)
			line += fmt.Sprintf("\t%.2fx /bin/true (%s)\t<= 3 ms", median(rs), fmtRatios(rs))
			cpuLine = fmt.Sprintf("\t%.3f ms\t%.2fx (%s)", median(cpu[i])*1e3, median(cs), fmtRatios(cs))
		case i >= 2: // exec: to ssh
			rs, cs := ratio(i, 1), ratioOf(cpu, i, 1)
			line += fmt.Sprintf("\t%.2fx ssh (%s)\t<= 0.33x", median(rs), fmtRatios(rs))
			cpuLine = fmt.Sprintf("\t%.3f ms\t%.2fx (%s)", median(cpu[i])*1e3, median(cs), fmtRatios(cs))
		}
		fmt.Fprintln(tw, line+cpuLine)
	}
	tw.Flush()
	for i := range 2 {
		a, b := clientAt+i, full+i
		rs, cs := ratio(a, b), ratioOf(cpu, a, b)
		fmt.Fprintf(&out, "%s / %s: %.3fx (%s); CPU %.3fx (%s)\n", sides[a].name, sides[b].name, median(rs), fmtRatios(rs), median(cs), fmtRatios(cs))
	}
	if *baseBin != "" {
		for i := range 2 {
			a, b := full+i, baseAt+i
			rs, cs := ratio(a, b), ratioOf(cpu, a, b)
			fmt.Fprintf(&out, "%s / base: %.3fx (%s); CPU %.3fx (%s)\n", sides[a].name, median(rs), fmtRatios(rs), median(cs), fmtRatios(cs))
		}
	}
	fmt.Print(out.String())
}

// runOnce runs argv to the end with env (nil: this process's), its output
// kept only for an error. It returns the process's CPU time (user +
// system; ssh's includes neither the master's nor sshd's, as tether exec's
// includes neither the coordinator's nor the agent's).
func runOnce(argv, env []string) (time.Duration, []byte, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var used time.Duration
	if cmd.ProcessState != nil {
		used = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return used, out.Bytes(), err
}

// copyBinary copies the executable src to dst (mode 0755) with plain
// writes, and returns dst.
func copyBinary(t *testing.T, src, dst string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("copy the binary under test: %v", err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatalf("copy the binary under test: %v", err)
	}
	return dst
}
