//go:build e2e && sshbench

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
)

// relayHopEnv, when set in the environment of this test binary, makes it a
// relay hop process instead (relayHopMain): the address to forward to.
const relayHopEnv = "TETHER_E2E_RELAY_HOP"

func init() {
	if to := os.Getenv(relayHopEnv); to != "" {
		relayHopMain(to)
	}
}

// relayHopMain is one hop of the per-process relay baseline: it listens on
// a loopback port, prints its address on stdout, and copies each
// connection to and from to (fleettest.RelayConn, as fleettest.TwoHopRelay's
// hops), until killed.
func relayHopMain(to string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay hop:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			fleettest.RelayConn(c, to)
		}()
	}
}

// processRelay starts hops relay hop processes (this test binary, see
// relayHopMain) chained in front of target and returns the first one's
// address: the shape of `tether forward` (CLI → coordinator → agent →
// target is three processes), with nothing in each but an io.Copy.
func processRelay(t *testing.T, target string, hops int) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := target
	for range hops {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), relayHopEnv+"="+addr)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatalf("relay hop process: no address: %v", err)
		}
		addr = strings.TrimSpace(line)
	}
	return addr
}

// TestForwardBenchmark compares `tether forward` (the CLI process, on the
// direct path and with TETHER_DIRECT=0 over NATS) with OpenSSH `ssh -L`
// (aes128-gcm, to a throwaway sshd on loopback) and a plain userspace
// relay of two io.Copy hops in the test process, and the same relay as three
// processes of one io.Copy hop each (relay-3proc: the process boundaries
// of the CLI, the coordinator and the agent, without their work), all in front of the same loopback target, in
// interleaved rounds (the order turned each round): bulk throughput of one
// stream (FWDBENCH_BULK_MIB, default 256) and the p50 round trip of 64-byte
// echoes (FWDBENCH_ECHOES, default 2000). It logs each path's medians and
// the median per-round ratios against the targets (direct bulk ≥
// 1.2× ssh -L and ≥ 0.5× the relay; RTT p50 ≤ 1.3× the relay), and
// asserts nothing. -tether-base-bin adds a whole fleet of another build
// (base-direct) in the same rounds, for an A/B of a change. Run with
//
//	go test -count=1 -tags 'e2e sshbench' -run '^TestForwardBenchmark$' -v ./e2e/
func TestForwardBenchmark(t *testing.T) {
	needTools(t, "ssh", "ssh-keygen", "sshd")
	if raceBuilt(t, *tetherBin) {
		plain := plainBinary(t)
		old := *tetherBin
		*tetherBin = plain
		t.Cleanup(func() { *tetherBin = old })
	}
	rounds := envInt(t, "FWDBENCH_ROUNDS", 5)
	bulk := int64(envInt(t, "FWDBENCH_BULK_MIB", 256)) << 20
	echoes := envInt(t, "FWDBENCH_ECHOES", 2000)

	target := fleettest.BenchTarget(t)
	relay := fleettest.TwoHopRelay(t, target)
	relay3 := processRelay(t, target, 3)

	pol := e2ePolicyWith(t, "      - nodes: \"*\"\n        operations: [forward]\n        targets: [bench]\n")
	f := startFleetArgs(t, pol)
	f.startAgentBin(t, *tetherBin, "node-a", "role=a", f.tokenFile, "--target", "bench="+target)
	f.waitNodes(t, "node-a")
	direct := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	natsFwd := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startForward(t, *tetherBin, f.natsURL, direct, []string{"TETHER_DIRECT=only"}) // no silent fallback
	startForward(t, *tetherBin, f.natsURL, natsFwd, []string{"TETHER_DIRECT=0"})
	var baseFwd string
	if *baseBin != "" {
		// A whole second fleet of the other build (coordinator, agent,
		// CLI), for tether's ratio to it in the same rounds.
		old := *tetherBin
		*tetherBin = *baseBin
		bf := startFleetArgs(t, pol)
		bf.startAgentBin(t, *baseBin, "node-a", "role=a", bf.tokenFile, "--target", "bench="+target)
		bf.waitNodes(t, "node-a")
		*tetherBin = old
		baseFwd = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		startForward(t, *baseBin, bf.natsURL, baseFwd, []string{"TETHER_DIRECT=only"})
	}

	key := newSSHKey(t, t.TempDir(), "fwd")
	sshd := startSSHD(t, key, nestedShell)
	sshL := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ssh := exec.Command("ssh", "-F", sshd.Config, "-N", "-o", "Ciphers=aes128-gcm@openssh.com", "-o", "ExitOnForwardFailure=yes",
		"-L", sshL+":"+target, sshd.Host)
	var sshLog bytes.Buffer
	ssh.Stdout, ssh.Stderr = &sshLog, &sshLog
	if err := ssh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ssh.Process.Kill()
		ssh.Wait()
		if t.Failed() {
			t.Logf("--- ssh -L log ---\n%s", sshLog.String())
		}
	})

	paths := []struct{ name, addr string }{{"relay", relay}, {"relay-3proc", relay3}, {"tether-direct", direct}, {"tether-nats", natsFwd}, {"ssh-L", sshL}}
	if baseFwd != "" {
		paths = append(paths, struct{ name, addr string }{"base-direct", baseFwd})
	}
	for _, p := range paths {
		waitEcho(t, p.name, p.addr)
	}
	bw := map[string][]float64{}
	rtt := map[string][]float64{}
	for r := range rounds {
		for i := range paths {
			p := paths[(i+r)%len(paths)]
			dial := func() (io.ReadWriteCloser, error) { return net.Dial("tcp", p.addr) }
			mbps, err := fleettest.MeasureBulk(dial, bulk)
			if err != nil {
				t.Fatalf("%s bulk: %v", p.name, err)
			}
			p50, err := fleettest.MeasureEcho(dial, echoes)
			if err != nil {
				t.Fatalf("%s echo: %v", p.name, err)
			}
			bw[p.name] = append(bw[p.name], mbps)
			rtt[p.name] = append(rtt[p.name], p50)
		}
	}
	ratio := func(m map[string][]float64, a, b string) float64 {
		v := make([]float64, rounds)
		for i := range v {
			v[i] = m[a][i] / m[b][i]
		}
		return fleettest.Median(v)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "forward benchmark, %d rounds, %d MiB bulk, %d echoes (medians):\n", rounds, bulk>>20, echoes)
	for _, p := range paths {
		fmt.Fprintf(&sb, "  %-14s bulk %8.1f MB/s   rtt p50 %7.1f µs\n", p.name, fleettest.Median(bw[p.name]), fleettest.Median(rtt[p.name]))
	}
	fmt.Fprintf(&sb, "  direct bulk / ssh -L  %.2f (target ≥ 1.2)\n", ratio(bw, "tether-direct", "ssh-L"))
	fmt.Fprintf(&sb, "  direct bulk / relay   %.2f (target ≥ 0.5)\n", ratio(bw, "tether-direct", "relay"))
	fmt.Fprintf(&sb, "  direct rtt / relay    %.2f (target ≤ 1.3)\n", ratio(rtt, "tether-direct", "relay"))
	fmt.Fprintf(&sb, "  direct rtt / ssh -L   %.2f\n", ratio(rtt, "tether-direct", "ssh-L"))
	fmt.Fprintf(&sb, "  direct rtt / relay-3proc %.2f   relay-3proc rtt / relay %.2f   direct bulk / relay-3proc %.2f\n",
		ratio(rtt, "tether-direct", "relay-3proc"), ratio(rtt, "relay-3proc", "relay"), ratio(bw, "tether-direct", "relay-3proc"))
	fmt.Fprintf(&sb, "  nats bulk / ssh -L    %.2f   nats bulk / relay %.2f   nats rtt / relay %.2f\n",
		ratio(bw, "tether-nats", "ssh-L"), ratio(bw, "tether-nats", "relay"), ratio(rtt, "tether-nats", "relay"))
	if baseFwd != "" {
		fmt.Fprintf(&sb, "  direct / base-direct (-tether-base-bin): bulk %.2f   rtt %.2f\n",
			ratio(bw, "tether-direct", "base-direct"), ratio(rtt, "tether-direct", "base-direct"))
	}
	t.Log(sb.String())
}

// startForward runs `bin forward node-a bench LOCAL` with the fleet's NATS
// environment and env until the test ends.
func startForward(t *testing.T, bin, natsURL, local string, env []string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "forward.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "forward", "node-a", "bench", local)
	cmd.Env = append(append(os.Environ(), natsEnv(natsURL)...), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- forward %s log ---\n%s", local, b)
		}
	})
}

// waitEcho waits until addr forwards to the target (an echo answers).
func waitEcho(t *testing.T, name, addr string) {
	t.Helper()
	checkFor(t, defaultTestTimeout, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("Eping")); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}
