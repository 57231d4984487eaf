package agent

import (
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// BenchmarkSSHAgainstOpenSSHD compares the agent's SSH server, reached as
// the OpenSSH tests reach it (ssh → ProxyCommand → loopback TCP → tunnel
// stream; the benchmark's tunnel is plain TCP, production's adds TLS),
// with a local OpenSSH sshd on a loopback port, in interleaved rounds
// (which goes first alternates). Per round it measures:
//
//   - cm20: 20 sequential `ssh host true` through one ControlMaster;
//   - fresh: 5 sequential `ssh host true`, each with a full handshake;
//   - bulk: `ssh host 'cat > /dev/null'` of TETHER_SSH_BENCH_MIB MiB
//     (default 256) of random bytes on stdin.
//
// It reports the median over rounds of each round's time ratio
// tether/sshd (below 1: the agent is faster). TETHER_SSH_BENCH_ROUNDS sets
// the rounds per iteration (default 5). Run with -benchtime=1x. It skips
// when ssh or /usr/sbin/sshd is missing (apt-get install -y openssh-server).
func BenchmarkSSHAgainstOpenSSHD(b *testing.B) {
	needBinary(b, "ssh")
	const sshdPath = "/usr/sbin/sshd"
	if _, err := os.Stat(sshdPath); err != nil {
		b.Skipf("no OpenSSH sshd to compare with (apt-get install -y openssh-server): %v", err)
	}
	rounds := envInt(b, "TETHER_SSH_BENCH_ROUNDS", 5)
	mib := envInt(b, "TETHER_SSH_BENCH_MIB", 256)

	f := newSSHFixture(b, func(c *Config) { c.Logger = nil })
	tether := newOpenSSH(b, f, nil)
	local := startOpenSSHD(b, sshdPath, f)

	type target struct {
		name string
		o    *openSSH
		host string
	}
	targets := []target{{"tether", tether, sshHost}, {"sshd", local, "127.0.0.1"}}
	block := make([]byte, 1<<20)
	rand.Read(block)

	measure := func(tg target, round int) (cm20, fresh, bulk time.Duration) {
		cp := filepath.Join(tg.o.dir, fmt.Sprintf("cm%d", round))
		stop := tg.o.startMasterTo(cp, tg.host)
		start := time.Now()
		for i := range 20 {
			if _, errs, code := tg.o.run("", "-o", "ControlMaster=no", "-o", "ControlPath="+cp, tg.host, "true"); code != 0 {
				b.Fatalf("%s: command %d through the master: exit %d: %s", tg.name, i, code, errs)
			}
		}
		cm20 = time.Since(start)
		stop()
		start = time.Now()
		for range 5 {
			if _, errs, code := tg.o.run("", tg.host, "true"); code != 0 {
				b.Fatalf("%s: ssh true: exit %d: %s", tg.name, code, errs)
			}
		}
		fresh = time.Since(start)
		cmd := tg.o.command("ssh", tg.host, "cat > /dev/null")
		cmd.Stdin = &repeatReader{block: block, left: int64(mib) << 20}
		start = time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: bulk: %v: %s", tg.name, err, out)
		}
		bulk = time.Since(start)
		return
	}

	var cmRatios, freshRatios, bulkRatios []float64
	for i := 0; i < b.N*rounds; i++ {
		var cm, fr, bu [2]time.Duration
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			cm[k], fr[k], bu[k] = measure(targets[k], i)
		}
		cmRatios = append(cmRatios, float64(cm[0])/float64(cm[1]))
		freshRatios = append(freshRatios, float64(fr[0])/float64(fr[1]))
		bulkRatios = append(bulkRatios, float64(bu[0])/float64(bu[1]))
		b.Logf("round %d: cm20 tether %v sshd %v | fresh×5 tether %v sshd %v | bulk %d MiB tether %v (%.0f MiB/s) sshd %v (%.0f MiB/s)",
			i, cm[0], cm[1], fr[0], fr[1], mib, bu[0], float64(mib)/bu[0].Seconds(), bu[1], float64(mib)/bu[1].Seconds())
	}
	b.ReportMetric(median(cmRatios), "cm20-time-ratio")
	b.ReportMetric(median(freshRatios), "fresh-time-ratio")
	b.ReportMetric(median(bulkRatios), "bulk-time-ratio")
}

func envInt(b testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
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
	n := copy(p[:min(int64(len(p)), r.left)], r.block[r.off:])
	r.off = (r.off + n) % len(r.block)
	r.left -= int64(n)
	return n, nil
}

// startOpenSSHD runs sshd on a free loopback port as the current user,
// with a temporary configuration accepting f's key, until the benchmark
// ends, and returns clients for it.
func startOpenSSHD(b testing.TB, sshdPath string, f *sshFixture) *openSSH {
	b.Helper()
	o := newOpenSSH(b, f, nil)
	_, hostPriv := newKey(b)
	hostKeyFile := filepath.Join(o.dir, "sshd_host_key")
	writeKeyFile(b, hostKeyFile, hostPriv)
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		b.Fatal(err)
	}
	auth := filepath.Join(o.dir, "authorized_keys")
	if err := os.WriteFile(auth, ssh.MarshalAuthorizedKey(f.key.PublicKey()), 0o600); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cfg := filepath.Join(o.dir, "sshd_config")
	conf := fmt.Sprintf(`Port %s
ListenAddress 127.0.0.1
HostKey %s
PidFile none
AuthorizedKeysFile %s
UsePAM no
StrictModes no
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
Subsystem sftp internal-sftp
MaxStartups 100
MaxSessions 100
LogLevel ERROR
`, port, hostKeyFile, auth)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.MkdirAll("/run/sshd", 0o755) // its privilege separation directory
	}
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", cfg)
	out, _ := os.Create(filepath.Join(o.dir, "sshd.log"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	b.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
		out.Close()
	})
	waitFor(b, testWait, "sshd to listen", func() bool {
		select {
		case err := <-waited:
			log, _ := os.ReadFile(out.Name())
			b.Fatalf("sshd exited: %v: %s", err, log)
		default:
		}
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	o.port = port
	line := "[127.0.0.1]:" + port + " " + string(ssh.MarshalAuthorizedKey(hostSigner.PublicKey()))
	if err := os.WriteFile(o.knownHosts, []byte(line), 0o600); err != nil {
		b.Fatal(err)
	}
	return o
}
