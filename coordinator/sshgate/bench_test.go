package sshgate

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// plainServer is the baseline: an x/crypto/ssh server with the same host
// key type that accepts one authorized key and every direct-tcpip channel,
// draining it, with none of the gate's logic (no policy, no params, no
// host certificate, no node).
func plainServer(tb testing.TB, allowed ssh.PublicKey) string {
	tb.Helper()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) != string(allowed.Marshal()) {
				return nil, io.EOF
			}
			return &ssh.Permissions{}, nil
		},
	}
	cfg.AddHostKey(newSigner(tb))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				defer sc.Close()
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					go ssh.DiscardRequests(creqs)
					go func() { io.Copy(io.Discard, ch); ch.Close() }()
				}
			}()
		}
	}()
	return l.Addr().String()
}

// connectOnce authenticates to addr with signer and opens a direct-tcpip
// to node-a:22, then closes: the cost of the jump hop before the inner
// handshake.
func connectOnce(tb testing.TB, addr string, signer ssh.Signer) time.Duration {
	start := time.Now()
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{
		User: "u", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
	})
	if err != nil {
		tb.Fatal(err)
	}
	ch, reqs, err := c.OpenChannel("direct-tcpip", ssh.Marshal(directTCPIP{Host: "node-a", Port: 22, OriginHost: "127.0.0.1", OriginPort: 1}))
	if err != nil {
		tb.Fatal(err)
	}
	d := time.Since(start)
	go ssh.DiscardRequests(reqs)
	ch.Close()
	c.Close()
	return d
}

// BenchmarkJumpHandshake times authenticate + open a direct-tcpip through
// the gate and through a plain x/crypto/ssh server, interleaved round by
// round, and reports both medians and their ratio (gate/plain).
func BenchmarkJumpHandshake(b *testing.B) {
	e := newEnv(b)
	e.nodes.drain = true
	plain := plainServer(b, e.bob.signer.PublicKey())
	gateAddr := e.addr.String()
	connectOnce(b, plain, e.bob.signer) // warm both
	connectOnce(b, gateAddr, e.bob.signer)
	var tg, tp []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			tp = append(tp, connectOnce(b, plain, e.bob.signer))
			tg = append(tg, connectOnce(b, gateAddr, e.bob.signer))
		} else {
			tg = append(tg, connectOnce(b, gateAddr, e.bob.signer))
			tp = append(tp, connectOnce(b, plain, e.bob.signer))
		}
	}
	b.StopTimer()
	mg, mp := median(tg), median(tp)
	b.ReportMetric(float64(mg.Microseconds()), "gate-µs")
	b.ReportMetric(float64(mp.Microseconds()), "plain-µs")
	b.ReportMetric(float64(mg)/float64(mp), "gate/plain")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
