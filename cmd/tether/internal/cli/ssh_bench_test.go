package cli

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSSHLatencyVsSSHD (TETHER_SSH_BENCH=1) measures `ssh HOST true`
// with a full handshake, and 20 sequential ones through one ControlMaster,
// against a local OpenSSH sshd on loopback, through the jump host
// (ProxyJump) and through tether ssh-proxy (ProxyCommand), in interleaved
// rounds, and logs the medians and their ratios to sshd's.
func TestSSHLatencyVsSSHD(t *testing.T) {
	mode := os.Getenv("TETHER_SSH_BENCH")
	if mode != "1" && mode != "bulk" {
		t.Skip("set TETHER_SSH_BENCH=1 to measure (bulk: the bulk copies only)")
	}
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if sshd = "/usr/sbin/sshd"; !fileExists(sshd) {
			t.Skip("no sshd")
		}
	}
	s := startSSHFleet(t)
	jump := s.config(t, "jump.conf", "--identity", s.key)
	proxy := s.config(t, "proxy.conf", "--proxy-command")

	// A local sshd for the same key, on a free loopback port.
	hostKey := filepath.Join(s.dir, "sshd_host_key")
	if b, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, b)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	sshdConf := filepath.Join(s.dir, "sshd_config")
	os.WriteFile(sshdConf, []byte(fmt.Sprintf("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile none\nUsePAM no\nStrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\n",
		port, hostKey, s.key+".pub")), 0o600)
	cmd := exec.Command(sshd, "-D", "-e", "-f", sshdConf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	local := filepath.Join(s.dir, "local.conf")
	os.WriteFile(local, []byte(fmt.Sprintf("Host local\n  HostName 127.0.0.1\n  Port %d\n  IdentityFile %s\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n", port, s.key)), 0o600)
	checkFor(t, defaultTestTimeout, func() error {
		if _, _, code := runSSH(t, local, "", "local", "true"); code != 0 {
			return fmt.Errorf("sshd not up")
		}
		return nil
	})

	type variant struct{ name, config, host string }
	vs := []variant{{"sshd", local, "local"}, {"jump", jump, "node-0.tether"}, {"ssh-proxy", proxy, "node-0.tether"}}
	// TETHER_SSH_BENCH_ALT_BIN: another build of this test binary, as a
	// further ssh-proxy side (an A/B of ssh-proxy changes in one run).
	if alt := os.Getenv("TETHER_SSH_BENCH_ALT_BIN"); alt != "" {
		self, _ := os.Executable()
		text, _ := os.ReadFile(proxy)
		altConf := filepath.Join(s.dir, "proxy-alt.conf")
		os.WriteFile(altConf, []byte(strings.ReplaceAll(string(text), self, alt)), 0o600)
		vs = append(vs, variant{"proxy-alt", altConf, "node-0.tether"})
	}
	fresh := map[string][]time.Duration{}
	muxed := map[string][]time.Duration{}
	rounds, perMaster := 5, 20
	if mode == "bulk" {
		rounds = 0
	}
	for r := 0; r < rounds; r++ {
		for i := range vs {
			v := vs[(i+r)%len(vs)] // interleaved, rotating the order
			start := time.Now()
			if _, e, code := runSSH(t, v.config, "", v.host, "true"); code != 0 {
				t.Fatalf("%s: exit %d: %s", v.name, code, e)
			}
			fresh[v.name] = append(fresh[v.name], time.Since(start))

			sock := filepath.Join(s.dir, fmt.Sprintf("cm-%s-%d", v.name, r))
			if _, e, code := runSSH(t, v.config, "", "-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-o", "ControlPath="+sock, "-fN", v.host); code != 0 {
				t.Fatalf("%s master: exit %d: %s", v.name, code, e)
			}
			for k := 0; k < perMaster; k++ {
				start := time.Now()
				if _, e, code := runSSH(t, v.config, "", "-o", "ControlMaster=no", "-o", "ControlPath="+sock, v.host, "true"); code != 0 {
					t.Fatalf("%s muxed: exit %d: %s", v.name, code, e)
				}
				muxed[v.name] = append(muxed[v.name], time.Since(start))
			}
			runSSH(t, v.config, "", "-o", "ControlPath="+sock, "-O", "exit", v.host)
		}
	}
	// Bulk: ssh HOST 'cat > /dev/null' < FILE, interleaved.
	const bulkMiB = 128
	bulk := filepath.Join(s.dir, "bulk")
	if err := os.WriteFile(bulk, make([]byte, bulkMiB<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	bulkTimes := map[string][]time.Duration{}
	for r := 0; r < 5; r++ {
		for i := range vs {
			v := vs[(i+r)%len(vs)]
			f, err := os.Open(bulk)
			if err != nil {
				t.Fatal(err)
			}
			c := exec.Command("ssh", "-F", v.config, "-o", "BatchMode=yes", v.host, "cat > /dev/null")
			c.Stdin, c.Env = f, append(os.Environ(), cliMainEnv+"=1")
			start := time.Now()
			out, err := c.CombinedOutput()
			f.Close()
			if err != nil {
				t.Fatalf("%s bulk: %v %s", v.name, err, out)
			}
			bulkTimes[v.name] = append(bulkTimes[v.name], time.Since(start))
		}
	}
	med := func(ds []time.Duration) time.Duration { ds = slices.Clone(ds); slices.Sort(ds); return ds[len(ds)/2] }
	mibps := func(d time.Duration) float64 { return bulkMiB / d.Seconds() }
	var b strings.Builder
	for _, v := range vs {
		if rounds == 0 {
			break
		}
		fmt.Fprintf(&b, "%-9s fresh median %7.1f ms (%.2fx sshd)   ControlMaster median %6.1f ms (%.2fx sshd)\n", v.name,
			float64(med(fresh[v.name]))/1e6, float64(med(fresh[v.name]))/float64(med(fresh["sshd"])),
			float64(med(muxed[v.name]))/1e6, float64(med(muxed[v.name]))/float64(med(muxed["sshd"])))
	}
	for _, v := range vs {
		fmt.Fprintf(&b, "%-9s bulk %d MiB median %6.1f MiB/s (%.2fx sshd)\n", v.name, bulkMiB,
			mibps(med(bulkTimes[v.name])), mibps(med(bulkTimes[v.name]))/mibps(med(bulkTimes["sshd"])))
	}
	t.Logf("%d interleaved rounds, %d muxed calls each:\n%s", rounds, perMaster, b.String())
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
