package fleettest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// Helpers of the forwarding benchmarks (BenchmarkForward here, the
// OpenSSH comparison in e2e): a target, a plain relay to compare with, and
// the two measurements.

// Median is the median of v (0 when empty).
func Median(v []float64) float64 {
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

// BenchTarget serves the benchmark's two modes on loopback: a
// connection's first byte picks it. 'B' then an 8-byte length: the bytes
// are read and discarded, then one byte answers; 'E': every byte is echoed.
func BenchTarget(tb testing.TB) string {
	return serveLoopback(tb, func(c net.Conn) {
		var mode [1]byte
		if _, err := io.ReadFull(c, mode[:]); err != nil {
			return
		}
		switch mode[0] {
		case 'B':
			var n [8]byte
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			// Big reads: the sink should cost little next to the paths.
			buf := make([]byte, 1<<20)
			for left := int64(binary.BigEndian.Uint64(n[:])); left > 0; {
				k, err := c.Read(buf[:min(left, int64(len(buf)))])
				left -= int64(k)
				if err != nil {
					return
				}
			}
			c.Write([]byte{1})
		case 'E':
			io.Copy(c, c)
		}
	})
}

// TwoHopRelay chains two userspace relays (io.Copy each way) in front
// of target and returns the first one's address.
func TwoHopRelay(tb testing.TB, target string) string {
	return startRelay(tb, startRelay(tb, target))
}

func startRelay(tb testing.TB, to string) string {
	return serveLoopback(tb, func(c net.Conn) { RelayConn(c, to) })
}

// RelayConn is one connection of a plain relay: it dials TCP address to
// and copies c to it and it to c (io.Copy each way, half-closing each
// side's write when its source ends) until both directions end; it
// returns at once if the dial fails. c is a *net.TCPConn; the caller
// closes it. The baseline relays of the forwarding benchmarks (here and
// e2e's relay hop processes) all copy with it.
func RelayConn(c net.Conn, to string) {
	u, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(u, c)
		u.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, u)
	c.(*net.TCPConn).CloseWrite()
	<-done
}

// serveLoopback listens on a loopback TCP port and runs handle on each
// connection in its own goroutine, closing the connection after; the
// listener closes, and every handler is waited for, at tb's cleanup. It
// returns the listener's address.
func serveLoopback(tb testing.TB, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// MeasureBulk sends n bytes through a new connection and returns the rate
// in MB/s, from the first byte to the target's acknowledgement.
func MeasureBulk(dial func() (io.ReadWriteCloser, error), n int64) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var hdr [9]byte
	hdr[0] = 'B'
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	buf := make([]byte, 256<<10)
	start := time.Now()
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := c.Write(buf[:k]); err != nil {
			return 0, err
		}
		left -= k
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, fmt.Errorf("ack: %w", err)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6, nil
}

// MeasureEcho sends k 64-byte messages one at a time through a new
// connection, each after the previous one's echo, and returns the median
// round trip in µs.
func MeasureEcho(dial func() (io.ReadWriteCloser, error), k int) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'E'}); err != nil {
		return 0, err
	}
	msg := make([]byte, 64)
	back := make([]byte, 64)
	rtts := make([]float64, 0, k)
	for i := range k + 50 {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return 0, err
		}
		if i >= 50 { // warm-up
			rtts = append(rtts, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	return Median(rtts), nil
}
