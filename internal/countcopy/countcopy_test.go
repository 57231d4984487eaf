package countcopy

import (
	"bytes"
	"errors"
	"io"
	"slices"
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

// chunkReader returns its data in reads of at most the sizes it is given in
// turn (the last one repeating), as a socket with that much buffered would.
type chunkReader struct {
	data  []byte
	sizes []int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), len(r.data), r.sizes[0])
	if len(r.sizes) > 1 {
		r.sizes = r.sizes[1:]
	}
	copy(p, r.data[:k])
	r.data = r.data[k:]
	return k, nil
}

// writeSizes records the size of every Write.
type writeSizes struct {
	buf   bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.buf.Write(p)
}

// CopyPooled copies everything intact and counts it; a source that fills
// every read is written in LargeBuf chunks after the first SmallBuf one; a
// trickle goes back to the small buffer (its reads come in SmallBuf
// buffers: a large source read after a trickle is cut at SmallBuf).
func TestCopyPooledFollowsTheTraffic(t *testing.T) {
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	// Bulk: 1 MiB readable each time.
	var w writeSizes
	var c sum
	n, err := CopyPooled(&w, &chunkReader{data: data, sizes: []int{1 << 20}}, &c)
	if err != nil || n != int64(len(data)) || !bytes.Equal(w.buf.Bytes(), data) || c.n != float64(len(data)) {
		t.Fatalf("bulk: CopyPooled = %d, %v; intact=%v counted %v", n, err, bytes.Equal(w.buf.Bytes(), data), c.n)
	}
	if w.sizes[0] != SmallBuf || w.sizes[1] != LargeBuf {
		t.Fatalf("bulk: first writes %v, want %d then %d", w.sizes[:2], SmallBuf, LargeBuf)
	}
	// Bulk, then a trickle of 100-byte reads, then bulk again.
	w = writeSizes{}
	sizes := []int{1 << 20, 1 << 20, 100, 100, 1 << 20}
	n, err = CopyPooled(&w, &chunkReader{data: data, sizes: sizes}, nil)
	if err != nil || n != int64(len(data)) || !bytes.Equal(w.buf.Bytes(), data) {
		t.Fatalf("mixed: CopyPooled = %d, %v; intact=%v", n, err, bytes.Equal(w.buf.Bytes(), data))
	}
	want := []int{SmallBuf, LargeBuf, 100, 100, SmallBuf, LargeBuf}
	if len(w.sizes) < len(want) {
		t.Fatalf("mixed: writes %v, want to start with %v", w.sizes, want)
	}
	for i, s := range want {
		if w.sizes[i] != s {
			t.Fatalf("mixed: writes %v, want to start with %v", w.sizes[:len(want)], want)
		}
	}
}

// readSizes records the size of every buffer Read was given.
type readSizes struct {
	r     io.Reader
	sizes []int
}

func (r *readSizes) Read(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	return r.r.Read(p)
}

// CopyFromChannel reads a bulk source up to HugeBuf at once (so a channel
// sends a quarter of the window adjusts CopyPooled's reads cost), yet
// writes at most LargeBuf at a time; it copies everything intact and counts
// it, and goes back to the small buffer for a trickle.
func TestCopyFromChannelReadsMoreWritesLargeBuf(t *testing.T) {
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	var w writeSizes
	var c sum
	r := &readSizes{r: &chunkReader{data: data, sizes: []int{2 << 20}}}
	n, err := CopyFromChannel(&w, r, &c)
	if err != nil || n != int64(len(data)) || !bytes.Equal(w.buf.Bytes(), data) || c.n != float64(len(data)) {
		t.Fatalf("CopyFromChannel = %d, %v; intact=%v counted %v", n, err, bytes.Equal(w.buf.Bytes(), data), c.n)
	}
	if largest := slices.Max(r.sizes); largest != HugeBuf {
		t.Fatalf("reads were given buffers of at most %d bytes, want %d", largest, HugeBuf)
	}
	if largest := slices.Max(w.sizes); largest != LargeBuf {
		t.Fatalf("writes of up to %d bytes, want at most %d", largest, LargeBuf)
	}
	// A trickle after bulk goes back to SmallBuf reads.
	r = &readSizes{r: &chunkReader{data: data[:4<<20], sizes: []int{2 << 20, 2 << 20, 2 << 20, 100, 100}}}
	if _, err := CopyFromChannel(io.Discard, r, nil); err != nil {
		t.Fatal(err)
	}
	if got := r.sizes[len(r.sizes)-1]; got != SmallBuf {
		t.Fatalf("after a trickle, reads of %d bytes, want %d (sizes %v)", got, SmallBuf, r.sizes)
	}
}
