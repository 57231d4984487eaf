// Package countcopy copies a byte stream while counting it into a metric,
// for the splices that relay bytes between a client and a node (the
// agent's dial streams, the SSH jump host's channels).
package countcopy

import "io"

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
