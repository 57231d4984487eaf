package cli

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/tetherfleet/tether/internal/countcopy"
)

type chunkReader struct{ left, max int }

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	r.max = max(r.max, len(p))
	n := min(len(p), r.left)
	r.left -= n
	return n, nil
}

type chunkWriter struct{ n, max int }

func (w *chunkWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	w.max = max(w.max, len(p))
	return len(p), nil
}

// tether ssh-proxy's copies (stdioCopy) move more than 32 KiB at a time
// between a pipe (OpenSSH's ProxyCommand stdin and stdout) and the
// stream under bulk: os.File's WriteTo and ReadFrom, which io.Copy calls
// and which copy through 32 KiB, are not used.
func TestStdioCopyBulkChunks(t *testing.T) {
	const total = 8 << 20
	t.Run("stdin to stream", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		countcopy.GrowPipe(r, countcopy.BulkPipe)
		go func() {
			block := bytes.Repeat([]byte{'x'}, 1<<20)
			for range total >> 20 {
				w.Write(block)
			}
			w.Close()
		}()
		dst := &chunkWriter{}
		if _, err := stdioCopy(dst, r); err != nil {
			t.Fatal(err)
		}
		if dst.n != total {
			t.Fatalf("the stream got %d bytes, want %d", dst.n, total)
		}
		if dst.max <= 32<<10 {
			t.Fatalf("the stream was written in chunks of at most %d bytes, want more than 32 KiB", dst.max)
		}
	})
	t.Run("stream to stdout", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		drained := make(chan int64)
		go func() { n, _ := io.Copy(io.Discard, r); drained <- n }()
		src := &chunkReader{left: total}
		if _, err := stdioCopy(w, src); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if n := <-drained; n != total {
			t.Fatalf("stdout got %d bytes, want %d", n, total)
		}
		if src.max <= 32<<10 {
			t.Fatalf("the stream was read in buffers of at most %d bytes, want more than 32 KiB", src.max)
		}
	})
}
