package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// countingWriter records each Write as one element.
type countingWriter struct{ writes []string }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func TestLinePrefixer(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string
	}{
		{"one line", []string{"hello\n"}, "n | hello\n"},
		{"two lines one chunk", []string{"a\nb\n"}, "n | a\nn | b\n"},
		{"line split across chunks", []string{"hel", "lo\nwor", "ld\n"}, "n | hello\nn | world\n"},
		{"partial last line flushed", []string{"a\nno newline"}, "n | a\nn | no newline\n"},
		{"empty lines", []string{"\n\n"}, "n | \nn | \n"},
		{"empty chunk", []string{""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			p := newLinePrefixer(&b, "n | ")
			for _, c := range tt.chunks {
				if n, err := p.Write([]byte(c)); n != len(c) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", c, n, err)
				}
			}
			if err := p.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// Complete lines of one chunk go out in a single write, and an incomplete
// line in none, so prefixers sharing a writer interleave only whole lines.
func TestLinePrefixerWritesWholeLines(t *testing.T) {
	var w countingWriter
	a := newLinePrefixer(&w, "a | ")
	b := newLinePrefixer(&w, "b | ")
	a.Write([]byte("1\n2\npart"))
	b.Write([]byte("x\n"))
	a.Write([]byte("ial\n"))
	want := []string{"a | 1\na | 2\n", "b | x\n", "a | partial\n"}
	if strings.Join(w.writes, "|") != strings.Join(want, "|") {
		t.Errorf("writes = %q, want %q", w.writes, want)
	}
}

func TestLinePrefixerBoundsPartialLine(t *testing.T) {
	var b bytes.Buffer
	p := newLinePrefixer(&b, "n | ")
	long := strings.Repeat("x", maxPartialLine)
	p.Write([]byte(long))
	if got, want := b.String(), "n | "+long+"\n"; got != want {
		t.Fatalf("a line of maxPartialLine bytes was not broken: got %d bytes", len(got))
	}
}

func TestExecOutputModes(t *testing.T) {
	chunks := []struct{ node, stream, data string }{
		{"a", "stdout", "one\ntw"},
		{"b", "stderr", "oops\n"},
		{"a", "stdout", "o\n"},
		{"b", "stdout", "tail"},
	}
	tests := []struct {
		name             string
		prefix, json     bool
		wantOut, wantErr string
	}{
		{"raw", false, false, "one\ntwo\ntail", "oops\n"},
		{"prefixed", true, false, "a | one\na | two\nb | tail\n", "b | oops\n"},
		{"json", false, true,
			`{"node":"a","stream":"stdout","data":"one\ntw"}` + "\n" +
				`{"node":"b","stream":"stderr","data":"oops\n"}` + "\n" +
				`{"node":"a","stream":"stdout","data":"o\n"}` + "\n" +
				`{"node":"b","stream":"stdout","data":"tail"}` + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			o := newExecOutput(&out, &errOut, tt.prefix, tt.json)
			for _, c := range chunks {
				o.handle(c.node, c.stream, []byte(c.data))
			}
			if err := o.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.wantOut || errOut.String() != tt.wantErr {
				t.Errorf("stdout %q stderr %q, want %q and %q", out.String(), errOut.String(), tt.wantOut, tt.wantErr)
			}
		})
	}
}

func TestExecOutputJSONNonUTF8(t *testing.T) {
	var b bytes.Buffer
	o := newExecOutput(&b, &b, false, true)
	o.handle("n", "stdout", []byte("plain <text> & more\n"))
	o.handle("n", "stdout", []byte{0xff, 0x00, 0xfe})
	// "é" (c3 a9) cut in two by a chunk boundary stays text.
	o.handle("n", "stderr", []byte("caf\xc3"))
	o.handle("n", "stderr", []byte("\xa9!"))
	// A cut character at the very end is flushed as raw bytes.
	o.handle("n", "stdout", []byte("end\xe2\x82"))
	if err := o.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `{"node":"n","stream":"stdout","data":"plain <text> & more\n"}
{"node":"n","stream":"stdout","data_b64":"/wD+"}
{"node":"n","stream":"stderr","data":"caf"}
{"node":"n","stream":"stderr","data":"é!"}
{"node":"n","stream":"stdout","data":"end"}
{"node":"n","stream":"stdout","data_b64":"4oI="}
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// A notice printed after output that stopped mid-line starts on a line of
// its own when stdout and stderr are one stream (a terminal, 2>&1), and
// adds nothing when they are not (fresh17 item 6: "hello worltether: ...").
func TestExecOutputNoticeAfterPartialStdout(t *testing.T) {
	var both bytes.Buffer
	o := newExecOutput(&both, &both, false, false)
	o.handle("vm", "stdout", []byte("hello worl"))
	o.EndLines(true)
	both.WriteString("tether: note\n")
	if got, want := both.String(), "hello worl\ntether: note\n"; got != want {
		t.Errorf("same stream: got %q, want %q", got, want)
	}

	var out, errw bytes.Buffer
	o = newExecOutput(&out, &errw, false, false)
	o.handle("vm", "stdout", []byte("hello worl"))
	o.EndLines(false)
	if out.String() != "hello worl" || errw.Len() != 0 {
		t.Errorf("separate streams: stdout %q, stderr %q; want %q and nothing", out.String(), errw.String(), "hello worl")
	}

	// A partial stderr line is ended either way, on stderr.
	errw.Reset()
	o = newExecOutput(&out, &errw, false, false)
	o.handle("vm", "stderr", []byte("warn"))
	o.EndLines(false)
	if errw.String() != "warn\n" {
		t.Errorf("partial stderr: got %q, want %q", errw.String(), "warn\n")
	}
}

func TestSameStream(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	for _, tc := range []struct {
		name string
		a, b io.Writer
		want bool
	}{
		{"one pipe", w, w, true},
		{"pipe and file", w, f, false},
		{"one buffer", &buf, &buf, true},
		{"buffer and pipe", &buf, w, false},
	} {
		if got := sameStream(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: sameStream = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// job logs --follow's note about a truncated output starts on a line of
// its own after output that ended mid-line, on one stream (as exec's).
func TestJobOutcomeNoteAfterPartialLine(t *testing.T) {
	var both bytes.Buffer
	e := &env{stdout: &both, stderr: &both}
	out := &lineTracker{w: &both}
	out.Write([]byte("hello worl"))
	st := &protocol.JobStatus{ID: "j", Node: "vm", State: protocol.JobExited, ExitCode: new(int), StdoutTruncated: true, StdoutBytes: 10}
	if err := jobOutcome(e, st, out.midLine()); err == nil {
		t.Fatal("no error for a truncated output")
	}
	if got := both.String(); !strings.HasPrefix(got, "hello worl\ntether: job j: stdout was truncated") {
		t.Errorf("got %q, want the note on a line of its own", got)
	}
}
