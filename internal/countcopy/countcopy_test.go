package countcopy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

type sum struct{ n float64 }

func (s *sum) Add(v float64) { s.n += v }

// failWriter takes max bytes, then fails.
type failWriter struct {
	buf bytes.Buffer
	max int
}

func (w *failWriter) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); len(p) > room {
		w.buf.Write(p[:room])
		return room, errors.New("disk full")
	}
	return w.buf.Write(p)
}

func TestCopyCountsWhatItWrote(t *testing.T) {
	src := strings.Repeat("x", 10_000)
	var dst bytes.Buffer
	var c sum
	n, err := Copy(&dst, strings.NewReader(src), make([]byte, 64), &c)
	if err != nil || n != 10_000 || dst.String() != src || c.n != 10_000 {
		t.Fatalf("Copy = %d, %v; copied %d bytes, counted %v", n, err, dst.Len(), c.n)
	}
	// A failing writer: what it took is returned and counted, with its error.
	w := &failWriter{max: 100}
	c = sum{}
	n, err = Copy(w, strings.NewReader(src), make([]byte, 64), &c)
	if err == nil || err.Error() != "disk full" || n != 100 || c.n != 100 {
		t.Fatalf("Copy to a failing writer = %d, %v, counted %v; want 100, disk full, 100", n, err, c.n)
	}
	// A failing reader's error is returned after what it gave.
	c = sum{}
	n, err = Copy(io.Discard, io.MultiReader(strings.NewReader("abc"), iotestErr{}), make([]byte, 64), &c)
	if !errors.Is(err, errRead) || n != 3 || c.n != 3 {
		t.Fatalf("Copy from a failing reader = %d, %v, counted %v", n, err, c.n)
	}
}

var errRead = errors.New("connection reset")

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errRead }
