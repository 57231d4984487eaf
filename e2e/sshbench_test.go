//go:build e2e && sshbench

package e2e

import (
	"bytes"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// TestSSHBenchmark compares Tether's SSH path (the jump host on the
// coordinator, the tunnel, the agent's SSH server) with a local OpenSSH
// sshd on loopback, with the same OpenSSH client, key and commands, in
// interleaved rounds (the order alternating each round), and prints each
// scenario's median per-round ratio against the target. It needs
// the build tags e2e and sshbench: run it with `make bench-ssh`.
//
// Settings (environment): SSHBENCH_ROUNDS (default 5), SSHBENCH_BULK_MIB
// (default 1024: the bulk copy's size), SSHBENCH_FILES (default 10000: the
// rsync tree's files), SSHBENCH_FRESH (default 5: full handshakes per
// round, averaged), SSHBENCH_CIPHERS (the only ciphers every client hop
// offers, e.g. aes128-gcm@openssh.com, so that sshd and Tether's servers
// use the same one), SSHBENCH_PROXY=0 (no tether ssh-proxy side),
// SSHBENCH_SCENARIOS (a comma-separated subset of cm, fresh, bulk, rsync;
// default all) and SSHBENCH_PERF (a directory: the whole machine is
// recorded with perf record -a -g during each tether side's first round of
// each scenario, into SIDE-SCENARIO.data there, for perf report --pid or
// --comm; the servers' pids are logged; that round's numbers then carry
// perf's cost). The ratios are reported, not asserted:
// a loaded machine moves them, and the targets are for an idle one.
var baseBin = flag.String("tether-base-bin", "", "make bench-ssh: another tether build to measure beside -tether-bin, in the same rounds")

func TestSSHBenchmark(t *testing.T) {
	needTools(t, "ssh", "ssh-keygen", "rsync", "sshd")
	if why := haveSSHCommands(t); why != "" {
		t.Skip(why)
	}
	if raceBuilt(t, *tetherBin) {
		plain := plainBinary(t)
		t.Logf("%s is built with -race; benchmarking %s instead", *tetherBin, plain)
		old := *tetherBin
		*tetherBin = plain
		t.Cleanup(func() { *tetherBin = old })
	}
	rounds := envInt(t, "SSHBENCH_ROUNDS", 5)
	bulkMiB := envInt(t, "SSHBENCH_BULK_MIB", 1024)
	nfiles := envInt(t, "SSHBENCH_FILES", 10000)
	fresh := envInt(t, "SSHBENCH_FRESH", 5)

	dir := t.TempDir()
	key := newSSHKey(t, dir, "bench")
	sshd := startSSHD(t, key, topLevelShell)
	jump, proxy, tetherPIDs := startBenchFleet(t, key)
	sides := []benchSide{
		{name: "sshd", env: nil, config: sshd.Config, host: sshd.Host, servers: []int{sshd.PID}},
		{name: "tether", env: jump.Env, config: jump.Config, host: hostAlias("node-a"), servers: tetherPIDs},
	}
	if *baseBin != "" {
		// Another build of tether, measured in the same rounds: the
		// table then also gives tether's ratio to it (make bench-ssh
		// BASE=path/to/old/tether).
		cur := *tetherBin
		*tetherBin = *baseBin
		baseJump, baseProxy, basePIDs := startBenchFleet(t, key)
		*tetherBin = cur
		sides = append(sides, benchSide{name: "tether base", env: baseJump.Env, config: baseJump.Config, host: hostAlias("node-a"), servers: basePIDs, base: true, of: 1})
		if os.Getenv("SSHBENCH_PROXY") != "0" {
			// Its ssh-proxy is the base build too (tether ssh-config
			// names the binary that wrote it).
			sides = append(sides, benchSide{name: "tether base ssh-proxy", env: baseProxy.Env, config: baseProxy.Config, host: hostAlias("node-a"), servers: basePIDs, base: true, of: len(sides) + 1})
		}
	}
	if os.Getenv("SSHBENCH_PROXY") != "0" {
		sides = append(sides, benchSide{name: "tether ssh-proxy", env: proxy.Env, config: proxy.Config, host: hostAlias("node-a"), servers: tetherPIDs})
	}

	if c := os.Getenv("SSHBENCH_CIPHERS"); c != "" {
		// Every hop of every side (the jump host's too: its ssh reads the
		// same file) offers only these ciphers.
		for i := range sides {
			sides[i].config = withOption(t, sides[i].config, "Ciphers "+c)
		}
	}

	tree := filepath.Join(dir, "tree")
	makeManyFiles(t, tree, nfiles)
	block := make([]byte, 1<<20)
	rand.Read(block)

	scenarios := []benchScenario{
		{key: "cm", name: "20 × ssh true via one ControlMaster", unit: "s", lowerBetter: true, target: 1.2, run: func(t *testing.T, s benchSide, round int) float64 {
			sock := filepath.Join(dir, fmt.Sprintf("cm-%s-%d", s.tag(), round))
			s.mustSSH(t, "-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-o", "ControlPath="+sock, "-N", s.host)
			defer s.run(t, nil, "-o", "ControlPath="+sock, "-O", "exit", s.host)
			start := time.Now()
			for range 20 {
				s.mustSSH(t, "-o", "ControlMaster=no", "-o", "ControlPath="+sock, s.host, "true")
			}
			return time.Since(start).Seconds()
		}},
		{key: "fresh", name: fmt.Sprintf("fresh ssh true, full handshake (mean of %d)", fresh), unit: "s", lowerBetter: true, target: 1.0, run: func(t *testing.T, s benchSide, round int) float64 {
			start := time.Now()
			for range fresh {
				s.mustSSH(t, "-o", "ControlMaster=no", "-o", "ControlPath=none", s.host, "true")
			}
			return time.Since(start).Seconds() / float64(fresh)
		}},
		{key: "bulk", name: fmt.Sprintf("ssh 'cat > /dev/null' < %d MiB", bulkMiB), unit: "MiB/s", lowerBetter: false, target: 0.8, run: func(t *testing.T, s benchSide, round int) float64 {
			start := time.Now()
			r := s.run(t, &repeatReader{block: block, left: int64(bulkMiB) << 20}, "-o", "ControlPath=none", s.host, "cat > /dev/null")
			if r.Code != 0 {
				t.Fatalf("%s: %v", s.name, r)
			}
			return float64(bulkMiB) / time.Since(start).Seconds()
		}},
		{key: "rsync", name: fmt.Sprintf("rsync -az of %d files", nfiles), unit: "files/s", lowerBetter: false, target: 0.9, run: func(t *testing.T, s benchSide, round int) float64 {
			dst := filepath.Join(dir, fmt.Sprintf("rsync-%s-%d", s.tag(), round))
			start := time.Now()
			r := runTool(t, bulkTimeout, nil, s.env, "", "rsync", "-az", "--delete", "-e", "ssh -o ControlPath=none -F "+shellQuote(s.config), tree+"/", s.host+":"+dst)
			el := time.Since(start).Seconds()
			if r.Code != 0 {
				t.Fatalf("%s: %v", s.name, r)
			}
			os.RemoveAll(dst)
			return float64(nfiles) / el
		}},
	}

	if only := os.Getenv("SSHBENCH_SCENARIOS"); only != "" {
		keep := strings.Split(only, ",")
		scenarios = slices.DeleteFunc(scenarios, func(sc benchScenario) bool { return !slices.Contains(keep, sc.key) })
		if len(scenarios) == 0 {
			t.Fatalf("SSHBENCH_SCENARIOS=%q: none of cm, fresh, bulk, rsync", only)
		}
	}
	perfDir := os.Getenv("SSHBENCH_PERF")

	results := make([][][]float64, len(scenarios)) // scenario → side → per-round values
	cpu := make([][][]float64, len(scenarios))     // the same, CPU seconds of clients and servers
	split := make([][][][]float64, len(scenarios)) // the same, CPU seconds of the clients, then of each server
	for i := range results {
		results[i] = make([][]float64, len(sides))
		cpu[i] = make([][]float64, len(sides))
		split[i] = make([][][]float64, len(sides))
	}
	for round := range rounds {
		for i, sc := range scenarios {
			// Each round starts with another side, so that no side always
			// runs first (or last) on a machine whose load drifts.
			for k := range sides {
				side := (k + round) % len(sides)
				before := benchCPU(t, sides[side].servers)
				var stopPerf func()
				if perfDir != "" && side != 0 && sides[side].perfDone(i) {
					t.Logf("perf: %s %s, servers %v", sides[side].name, sc.key, sides[side].servers)
					stopPerf = startPerf(t, filepath.Join(perfDir, sides[side].tag()+"-"+sc.key+".data"))
				}
				results[i][side] = append(results[i][side], sc.run(t, sides[side], round))
				if stopPerf != nil {
					stopPerf()
				}
				waitNoChildren(t, sides[side].servers) // their CPU is counted once they are reaped
				after := benchCPU(t, sides[side].servers)
				total := 0.0
				for k := range after {
					after[k] -= before[k]
					total += after[k]
				}
				cpu[i][side] = append(cpu[i][side], total)
				split[i][side] = append(split[i][side], after)
			}
		}
		t.Logf("round %d of %d done", round+1, rounds)
	}

	var out bytes.Buffer
	fmt.Fprintf(&out, "SSH benchmark: %d interleaved rounds, OpenSSH client %s, %d cores, load %s\n",
		rounds, sshVersion(t), runtime.NumCPU(), loadAvg())
	if c := os.Getenv("SSHBENCH_CIPHERS"); c != "" {
		fmt.Fprintf(&out, "ciphers offered: %s (SSHBENCH_CIPHERS)\n", c)
	}
	tw := tabwriter.NewWriter(&out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tside\tmedian\tratio to sshd (median of rounds; each round)\ttarget\tmet\tCPU s (ratio)\tCPU s: clients/servers")
	for i, sc := range scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%.4g %s\t\t\t\t%.3g\t%s\n", sc.name, sides[0].name, median(results[i][0]), sc.unit, median(cpu[i][0]), fmtSplit(split[i][0]))
		for side := 1; side < len(sides); side++ {
			var ratios []float64
			for r := range rounds {
				// A time's ratio is tether/sshd (lower is better), a rate's
				// too (higher is better).
				ratios = append(ratios, results[i][side][r]/results[i][0][r])
			}
			ratio := median(ratios)
			met, cmp := ratio <= sc.target, "<="
			if !sc.lowerBetter {
				met, cmp = ratio >= sc.target, ">="
			}
			var cpuRatios []float64
			for r := range rounds {
				cpuRatios = append(cpuRatios, cpu[i][side][r]/cpu[i][0][r])
			}
			fmt.Fprintf(tw, "\t%s\t%.4g %s\t%.3fx (%s)\t%s %.1fx\t%s\t%.3g (%.2fx)\t%s\n", sides[side].name,
				median(results[i][side]), sc.unit, ratio, fmtRatios(ratios), cmp, sc.target, yesNo(met),
				median(cpu[i][side]), median(cpuRatios), fmtSplit(split[i][side]))
		}
	}
	tw.Flush()
	for base := range sides {
		if !sides[base].base {
			continue
		}
		of := sides[base].of
		fmt.Fprintf(&out, "%s / %s (%s), median of per-round ratios (time: lower is better; rate: higher):\n", sides[of].name, sides[base].name, *baseBin)
		for i, sc := range scenarios {
			var ratios, cpuRatios []float64
			for r := range rounds {
				ratios = append(ratios, results[i][of][r]/results[i][base][r])
				cpuRatios = append(cpuRatios, cpu[i][of][r]/cpu[i][base][r])
			}
			fmt.Fprintf(&out, "  %s: %.3fx (%s); CPU %.3fx (%s)\n", sc.name, median(ratios), fmtRatios(ratios), median(cpuRatios), fmtRatios(cpuRatios))
		}
	}
	fmt.Fprintln(&out, "CPU s: user+system seconds of the clients (ssh, rsync and their children) and the servers (sshd and its")
	fmt.Fprintln(&out, "connections; the coordinator, the agent and its children), median of rounds; a ControlPersist master")
	fmt.Fprintln(&out, "detaches, so its own CPU is not counted on either side. Under load the CPU ratio is the steadier one.")
	fmt.Fprintln(&out, "clients/servers: the clients' median, then each server's (sshd; the coordinator, then the agent).")
	fmt.Print(out.String()) // make bench-ssh runs with -v: stdout shows as it comes
}

// benchSide is one server under test: the ssh config and host to reach it.
type benchSide struct {
	name, config, host string
	env                []string
	servers            []int // the server processes whose CPU counts (with their reaped children)
	base               bool  // another build of tether (-tether-base-bin), for tether's ratio to it
	of                 int   // a base side's counterpart: the index of the side of the build under test
	perfed             map[int]bool
}

// perfDone reports whether scenario i of s is still to be recorded by
// perf (SSHBENCH_PERF), and marks it recorded.
func (s *benchSide) perfDone(i int) bool {
	if s.perfed == nil {
		s.perfed = map[int]bool{}
	}
	if s.perfed[i] {
		return false
	}
	s.perfed[i] = true
	return true
}

// startPerf runs perf record -a -g into file, and returns the function
// that stops it and waits until it has written the file.
func startPerf(t *testing.T, file string) func() {
	t.Helper()
	os.MkdirAll(filepath.Dir(file), 0o755)
	c := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", file)
	c.Stdout, c.Stderr = io.Discard, io.Discard
	if err := c.Start(); err != nil {
		t.Fatalf("perf record: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // perf attaches
	return func() {
		c.Process.Signal(os.Interrupt)
		c.Wait()
	}
}

// tag is the side's name as a file name part.
func (s benchSide) tag() string { return strings.ReplaceAll(s.name, " ", "-") }

func (s benchSide) run(t *testing.T, stdin io.Reader, args ...string) toolRun {
	t.Helper()
	return runTool(t, bulkTimeout, stdin, s.env, "", "ssh", append([]string{"-F", s.config}, args...)...)
}

func (s benchSide) mustSSH(t *testing.T, args ...string) {
	t.Helper()
	if r := s.run(t, nil, args...); r.Code != 0 {
		t.Fatalf("%s: %v", s.name, r)
	}
}

// benchScenario is one measurement; run returns a round's value in unit.
type benchScenario struct {
	key         string // its name in SSHBENCH_SCENARIOS
	name, unit  string
	lowerBetter bool    // a time (ratio tether/sshd <= target) or a rate (>= target)
	target      float64 // the target ratio
	run         func(t *testing.T, s benchSide, round int) float64
}

// startBenchFleet is a coordinator with its jump host trusting key, and
// one agent node-a, and returns the ways in that tether ssh-config prints:
// through the jump host, and through tether ssh-proxy.
func startBenchFleet(t *testing.T, key sshKey) (jump, proxy *sshClient, pids []int) {
	t.Helper()
	dir := t.TempDir()
	login := currentUser(t)
	authorized := filepath.Join(dir, "authorized_keys")
	pub, _ := os.ReadFile(key.Pub)
	os.WriteFile(authorized, pub, 0o600)
	grant := fmt.Sprintf("      - nodes: \"*\"\n        operations: [ssh]\n        run_as: %s\n", login)
	pol := sshPolicy(t, grant) + fmt.Sprintf("  ssh-key:%s:\n    rules:\n%s", key.Fingerprint, grant)
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(pol), 0o600)
	jumpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f := startFleetArgs(t, policy, "--ssh-addr", jumpAddr, "--ssh-authorized-keys", authorized)
	agent := f.startAgentBin(t, *tetherBin, "node-a", "role=a", f.tokenFile)
	f.waitNodes(t, "node-a")
	s := &sshFleet{fleet: f, dir: dir, login: login, jumpAddr: jumpAddr}
	return s.client(t, "bench", key), s.client(t, "bench-proxy", key, "--proxy-command"),
		[]int{f.coord.cmd.Process.Pid, agent.cmd.Process.Pid}
}

// withOption writes a copy of the ssh config file with line first (ssh
// takes the first value of an option) and returns the copy's path.
func withOption(t *testing.T, config, line string) string {
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	out := config + ".opt"
	if err := os.WriteFile(out, append([]byte(line+"\n"), b...), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// benchCPU is the user+system CPU, in seconds, of this process's waited-for
// children (the clients each scenario ran), then of each server process
// with its waited-for children (/proc/PID/stat utime, stime, cutime,
// cstime).
func benchCPU(t *testing.T, servers []int) []float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	out := []float64{time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()}
	for _, pid := range servers {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("server process %d: %v", pid, err)
		}
		// Fields after the command's closing parenthesis: state is the
		// 3rd field of the line, utime..cstime the 14th to 17th.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		sec := 0.0
		for _, v := range f[11:15] {
			ticks, _ := strconv.ParseFloat(v, 64)
			sec += ticks / clockTicks
		}
		out = append(out, sec)
	}
	return out
}

// waitNoChildren waits, up to 10 s, until none of the processes has a
// child (sshd's per-connection processes, the agent's commands), so that
// their CPU is in the parent's cutime and cstime.
func waitNoChildren(t *testing.T, pids []int) {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
			if err != nil || len(bytes.TrimSpace(b)) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// fmtSplit formats per-round CPU splits as the median of each part,
// slash-separated.
func fmtSplit(rounds [][]float64) string {
	if len(rounds) == 0 {
		return ""
	}
	parts := make([]string, len(rounds[0]))
	for k := range parts {
		var v []float64
		for _, r := range rounds {
			v = append(v, r[k])
		}
		parts[k] = fmt.Sprintf("%.3g", median(v))
	}
	return strings.Join(parts, "/")
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times (100 on Linux).
const clockTicks = 100

// repeatReader yields block over and over, left bytes in all.
type repeatReader struct {
	block []byte
	off   int
	left  int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	n := copy(p, r.block[r.off:])
	if int64(n) > r.left {
		n = int(r.left)
	}
	r.off = (r.off + n) % len(r.block)
	r.left -= int64(n)
	return n, nil
}

// raceBuilt reports whether bin was built with -race (go version -m).
func raceBuilt(t *testing.T, bin string) bool {
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", bin, err)
	}
	return bytes.Contains(out, []byte("-race=true"))
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func sshVersion(t *testing.T) string {
	out, _ := exec.Command("ssh", "-V").CombinedOutput()
	return strings.TrimSpace(string(out))
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
