package sshd

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// sizeReader yields left bytes and records the largest buffer it was
// asked to fill; sizeWriter records the largest write it was given.
type sizeReader struct {
	left, max int
}

func (r *sizeReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	r.max = max(r.max, len(p))
	n := min(len(p), r.left)
	r.left -= n
	return n, nil
}

type sizeWriter struct{ n, max int }

func (w *sizeWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	w.max = max(w.max, len(p))
	return len(p), nil
}

// A bulk relay between the channel and a command's pipe moves more than
// 32 KiB at a time both ways: the pipe's ReadFrom and WriteTo (which
// io.Copy and io.CopyBuffer call, and which copy through 32 KiB) are not
// used.
func TestPipeCopyBulkChunks(t *testing.T) {
	const total = 8 << 20
	t.Run("channel to stdin", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		drained := make(chan int64)
		go func() { n, _ := io.Copy(io.Discard, r); drained <- n }()
		src := &sizeReader{left: total}
		pipeCopy(w, src)
		w.Close()
		if n := <-drained; n != total {
			t.Fatalf("the pipe got %d bytes, want %d", n, total)
		}
		if src.max <= 32<<10 {
			t.Fatalf("the channel was read in buffers of at most %d bytes, want more than 32 KiB", src.max)
		}
	})
	t.Run("stdout to channel", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		go func() {
			// Large writes, so that the pipe often holds more than 32 KiB
			// when it is read.
			block := bytes.Repeat([]byte{'x'}, 1<<20)
			for range total >> 20 {
				w.Write(block)
			}
			w.Close()
		}()
		dst := &sizeWriter{}
		pipeCopy(dst, r)
		if dst.n != total {
			t.Fatalf("the channel got %d bytes, want %d", dst.n, total)
		}
		if dst.max <= 32<<10 {
			t.Fatalf("the channel was written in chunks of at most %d bytes, want more than 32 KiB", dst.max)
		}
	})
}
