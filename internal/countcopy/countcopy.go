// Package countcopy copies a byte stream while counting it into a metric,
// for the splices that relay bytes between a client and a node (the
// agent's dial streams, the SSH jump host's channels).
package countcopy

import (
	"io"
	"sync"
)

// Counter is what Copy adds to: a prometheus.Counter has it.
type Counter interface{ Add(float64) }

// Copy copies src to dst through buf until src's EOF (a nil error) or a
// failure, adding every chunk written to c as it goes, and returns the
// bytes written. Its own loop, rather than io.Copy, keeps dst's ReadFrom
// and src's WriteTo out of the way, so that every byte is counted when it
// passes, not at the end.
func Copy(dst io.Writer, src io.Reader, buf []byte, c Counter) (int64, error) {
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			c.Add(float64(w))
			if werr != nil {
				return total, werr
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// Buffer sizes of CopyPooled: small while the traffic is interactive or
// idle, large once a read filled the small one (bulk).
const (
	SmallBuf = 32 << 10
	LargeBuf = 256 << 10
)

// BulkPipe is the size, in bytes, GrowPipe is asked for by the copies
// that feed or drain a pipe (an SSH command's stdin and stdout, tether
// ssh-proxy's stdin and stdout): four LargeBuf writes.
const BulkPipe = 1 << 20

// HugeBuf is CopyFromChannel's read buffer under bulk, in bytes.
const HugeBuf = 1 << 20

var (
	smallBufs = sync.Pool{New: func() any { b := make([]byte, SmallBuf); return &b }}
	largeBufs = sync.Pool{New: func() any { b := make([]byte, LargeBuf); return &b }}
	hugeBufs  = sync.Pool{New: func() any { b := make([]byte, HugeBuf); return &b }}
)

// tiers are the buffer pools of a pooled copy, smallest first.
var (
	pooledTiers  = []*sync.Pool{&smallBufs, &largeBufs}
	channelTiers = []*sync.Pool{&smallBufs, &largeBufs, &hugeBufs}
)

// CopyPooled is Copy through pooled buffers whose size follows the
// traffic: it reads into a SmallBuf buffer, moves to a LargeBuf one after a
// read that filled it, and back after a read shorter than SmallBuf. A bulk
// transfer so reaches a tunnel stream in 256 KiB writes, each one yamux
// frame whose TLS records leave in one system call (tunnel/cork.go), and is
// read out of the stream in as large reads, about 1.15x the throughput of
// 32 KiB copies for 0.9x the CPU per byte (tunnel BenchmarkABCopyChunk);
// while a copy waits for an idle peer it holds a small buffer only. c may
// be nil (nothing counted). It returns what Copy returns.
func CopyPooled(dst io.Writer, src io.Reader, c Counter) (int64, error) {
	return copyTiers(dst, src, c, pooledTiers)
}

// CopyFromChannel is CopyPooled for a source whose reads each cost a
// message back to its sender: an x/crypto/ssh channel answers a read
// with a window adjust once more than 96 KiB of its 2 MiB window was
// consumed, a packet the connection encrypts and writes, and the client
// decrypts. Under bulk it reads up to HugeBuf at once (one adjust per MiB
// instead of one per 256 KiB read), and still writes dst in pieces of at
// most LargeBuf, so that a tunnel stream's frames stay what CopyPooled
// makes them. c may be nil. It returns what Copy returns.
func CopyFromChannel(dst io.Writer, src io.Reader, c Counter) (int64, error) {
	return copyTiers(dst, src, c, channelTiers)
}

// copyTiers is the pooled copy: it reads into a buffer of tiers[k],
// starting at k = 0, moves up a tier after a read that filled its buffer
// and back to the first after a read shorter than SmallBuf, and writes at
// most LargeBuf at a time.
func copyTiers(dst io.Writer, src io.Reader, c Counter, tiers []*sync.Pool) (int64, error) {
	k := 0
	bp := tiers[0].Get().(*[]byte)
	defer func() { tiers[k].Put(bp) }()
	var total int64
	for {
		buf := *bp
		n, rerr := src.Read(buf)
		for off := 0; off < n; {
			end := min(n, off+LargeBuf)
			w, werr := dst.Write(buf[off:end])
			total += int64(w)
			if c != nil {
				c.Add(float64(w))
			}
			if werr != nil {
				return total, werr
			}
			off = end
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
		switch {
		case n == len(buf) && k+1 < len(tiers):
			tiers[k].Put(bp)
			k++
			bp = tiers[k].Get().(*[]byte)
		case n < SmallBuf && k > 0:
			tiers[k].Put(bp)
			k = 0
			bp = tiers[0].Get().(*[]byte)
		}
	}
}
