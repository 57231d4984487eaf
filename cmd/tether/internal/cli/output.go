package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"unicode/utf8"

	"github.com/tetherfleet/tether/protocol"
)

// maxPartialLine bounds how much of an unterminated line a linePrefixer
// holds; a longer line is broken with a newline so memory stays bounded.
const maxPartialLine = 64 << 10

// linePrefixer writes what it is given to w with prefix at the start of every
// line. It buffers an unterminated last line until it is completed, grows
// past maxPartialLine, or Flush is called. Not safe for concurrent use.
type linePrefixer struct {
	w      io.Writer
	prefix []byte
	buf    []byte // the unterminated line, without prefix
	out    []byte // scratch for one Write's output
}

func newLinePrefixer(w io.Writer, prefix string) *linePrefixer {
	return &linePrefixer{w: w, prefix: []byte(prefix)}
}

// Write writes every complete line in data with one call to w, so lines from
// several prefixers sharing w never interleave mid-line.
func (p *linePrefixer) Write(data []byte) (int, error) {
	n := len(data)
	p.out = p.out[:0]
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			p.buf = append(p.buf, data...)
			if len(p.buf) >= maxPartialLine {
				p.emit(true)
			}
			break
		}
		p.buf = append(p.buf, data[:i+1]...)
		p.emit(false)
		data = data[i+1:]
	}
	if len(p.out) == 0 {
		return n, nil
	}
	_, err := p.w.Write(p.out)
	return n, err
}

// emit moves the buffered line, prefixed, to out, adding a newline if asked.
func (p *linePrefixer) emit(newline bool) {
	p.out = append(p.out, p.prefix...)
	p.out = append(p.out, p.buf...)
	if newline {
		p.out = append(p.out, '\n')
	}
	p.buf = p.buf[:0]
}

// Flush writes a buffered partial line, completed with a newline.
func (p *linePrefixer) Flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	p.out = p.out[:0]
	p.emit(true)
	_, err := p.w.Write(p.out)
	return err
}

// execOutput routes a job's output chunks to the terminal (see the package
// doc for the three modes). The first write error is kept and further output
// dropped, so a closed pipe does not stop the job from being waited for.
type execOutput struct {
	stdout, stderr io.Writer
	prefix         bool // several nodes: prefix lines with the node id
	json           *json.Encoder
	prefixers      map[[2]string]*linePrefixer
	order          []*linePrefixer // creation order, for Flush
	// partial holds, in --json mode, the start of a UTF-8 character that a
	// chunk boundary cut, per node and stream, until the next chunk.
	partial      map[[2]string][]byte
	partialOrder [][2]string // first-seen order, for Flush
	// midLine are the streams whose last byte written (unprefixed mode)
	// was not a newline.
	midLine map[string]bool
	err     error
}

func newExecOutput(stdout, stderr io.Writer, prefix, asJSON bool) *execOutput {
	o := &execOutput{stdout: stdout, stderr: stderr, prefix: prefix, prefixers: map[[2]string]*linePrefixer{}}
	if asJSON {
		o.json = json.NewEncoder(stdout)
		o.json.SetEscapeHTML(false)
	}
	return o
}

// outputLine is one output chunk in --json mode. Exactly one of Data and
// DataB64 is set: Data when the chunk is valid UTF-8 (JSON strings cannot
// carry anything else without mangling it), else DataB64, the raw bytes in
// base64.
type outputLine struct {
	Node    string  `json:"node"`
	Stream  string  `json:"stream"`
	Data    *string `json:"data,omitempty"`
	DataB64 []byte  `json:"data_b64,omitempty"`
}

// jsonChunk writes one --json output line for data.
func (o *execOutput) jsonChunk(node, stream string, data []byte) error {
	l := outputLine{Node: node, Stream: stream}
	if utf8.Valid(data) {
		s := string(data)
		l.Data = &s
	} else {
		l.DataB64 = data
	}
	return o.json.Encode(l)
}

// incompleteTail returns how many bytes at the end of b are the start of a
// UTF-8 character cut short (0 to 3).
func incompleteTail(b []byte) int {
	for n := 1; n <= utf8.UTFMax-1 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0 // ASCII: nothing cut
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}

// handle is the client.OutputHandler.
func (o *execOutput) handle(node, stream string, data []byte) {
	if o.err != nil {
		return
	}
	switch {
	case o.json != nil:
		// A chunk boundary may cut a character in two; hold its start back
		// for the next chunk so that text stays text.
		k := [2]string{node, stream}
		if p, ok := o.partial[k]; ok && len(p) > 0 {
			data = append(p, data...)
		}
		cut := incompleteTail(data)
		if o.partial == nil {
			o.partial = map[[2]string][]byte{}
		}
		if _, seen := o.partial[k]; !seen {
			o.partialOrder = append(o.partialOrder, k)
		}
		o.partial[k] = append([]byte(nil), data[len(data)-cut:]...)
		if data = data[:len(data)-cut]; len(data) > 0 {
			o.err = o.jsonChunk(node, stream, data)
		}
	case o.prefix:
		k := [2]string{node, stream}
		p := o.prefixers[k]
		if p == nil {
			p = newLinePrefixer(o.writer(stream), node+" | ")
			o.prefixers[k] = p
			o.order = append(o.order, p)
		}
		_, o.err = p.Write(data)
	default:
		if len(data) > 0 {
			if o.midLine == nil {
				o.midLine = map[string]bool{}
			}
			o.midLine[stream] = data[len(data)-1] != '\n'
		}
		_, o.err = o.writer(stream).Write(data)
	}
}

// EndLine ends stream's line with a newline when its output (unprefixed
// mode) stopped mid-line, so that what follows starts on a line of its
// own.
func (o *execOutput) EndLine(stream string) {
	if o.err == nil && o.midLine[stream] {
		_, o.err = io.WriteString(o.writer(stream), "\n")
		o.midLine[stream] = false
	}
}

// writeJSON writes v as the --json output of a command that is not a
// stream (every one but exec and audit, which write JSON lines): one JSON
// document, indented by two spaces, HTML characters unescaped (a
// command's && stays readable), a newline after it. A list is written as
// an object naming it ({"nodes": […]}), never bare.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// EndLines prepares for a notice on stderr: it ends stderr's line when that
// stopped mid-line and, when same (stdout and stderr are one stream: a
// terminal, 2>&1), also ends stdout's, with a newline on stderr, so the
// notice is not glued to output such as a truncated last line. Separate
// streams get nothing extra: stdout's bytes stay exactly what the node
// produced.
func (o *execOutput) EndLines(same bool) {
	o.EndLine(protocol.ReplyStderr)
	if o.err == nil && same && o.midLine[protocol.ReplyStdout] {
		_, o.err = io.WriteString(o.stderr, "\n")
		o.midLine[protocol.ReplyStdout] = false
	}
}

// lineTracker passes writes to w and remembers whether the last byte
// written was not a newline, for a notice that follows to start on a line
// of its own.
type lineTracker struct {
	w   io.Writer
	mid bool
}

func (t *lineTracker) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if n > 0 {
		t.mid = p[n-1] != '\n'
	}
	return n, err
}

// midLine reports whether the output stopped mid-line.
func (t *lineTracker) midLine() bool { return t != nil && t.mid }

// sameStream reports whether a and b write to one place: the same open
// file, pipe or terminal (os.SameFile), or the same writer value.
func sameStream(a, b io.Writer) bool {
	fa, okA := a.(*os.File)
	fb, okB := b.(*os.File)
	if okA && okB {
		sa, errA := fa.Stat()
		sb, errB := fb.Stat()
		return errA == nil && errB == nil && os.SameFile(sa, sb)
	}
	if okA != okB || a == nil || b == nil || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// nodeResultLine is a node's result in --json mode: a
// *protocol.NodeResult, or a startedResult of a detached job.
type nodeResultLine struct {
	NodeResult any `json:"node_result"`
}

// nodeResult writes one --json node result line, after the node's held-back
// output bytes.
func (o *execOutput) nodeResult(r *protocol.NodeResult) {
	o.FlushNode(r.Node)
	if o.err == nil && o.json != nil {
		o.err = o.json.Encode(nodeResultLine{jsonNodeResult(r)})
	}
}

// startedResult is, in --json mode, the result of a node that started a
// detached job (NodeResult.Detached): it has not exited, so it has no exit
// code, duration or output sizes yet; `tether job status ID` has them.
type startedResult struct {
	Node     string `json:"node"`
	State    string `json:"state"` // protocol.JobRunning
	Detached bool   `json:"detached"`
}

// jsonNodeResult is r as --json prints it: a startedResult when r is of a
// node that started a detached job, else r.
func jsonNodeResult(r *protocol.NodeResult) any {
	if r.Detached {
		return startedResult{Node: r.Node, State: protocol.JobRunning, Detached: true}
	}
	return r
}

// detachedExecResult is, in --json mode, the result of exec --detach:
// protocol.ExecResult with Started (the nodes that started the job, whose
// results are startedResults) in place of Succeeded, as no node's run has
// ended yet. Failed counts the nodes that could not start it.
type detachedExecResult struct {
	ID             string `json:"id"`
	Results        []any  `json:"results"`
	ResultsOmitted bool   `json:"results_omitted,omitempty"`
	Nodes          int    `json:"nodes"`
	Started        int    `json:"started"`
	Failed         int    `json:"failed"`
}

// jsonExecResult is res as --json prints it: a detachedExecResult for
// exec --detach, else res.
func jsonExecResult(res *protocol.ExecResult, detach bool) any {
	if !detach {
		return res
	}
	d := detachedExecResult{ID: res.ID, Results: make([]any, len(res.Results)), ResultsOmitted: res.ResultsOmitted, Nodes: res.Nodes, Failed: res.Failed}
	for i := range res.Results {
		r := &res.Results[i]
		if r.Detached {
			d.Started++
		}
		d.Results[i] = jsonNodeResult(r)
	}
	if len(res.Results) == 0 && res.ResultsOmitted {
		// No results to count: every node that did not fail started it.
		d.Started = res.Nodes - res.Failed
	}
	return d
}

// FlushNode completes node's partial lines (or, in --json mode, writes its
// held-back bytes): the node is done, nothing more will come from it.
func (o *execOutput) FlushNode(node string) {
	for _, stream := range []string{protocol.ReplyStdout, protocol.ReplyStderr} {
		k := [2]string{node, stream}
		if p := o.partial[k]; len(p) > 0 && o.err == nil {
			o.err = o.jsonChunk(node, stream, p)
		}
		if o.partial != nil {
			o.partial[k] = nil
		}
		if p := o.prefixers[k]; p != nil {
			if err := p.Flush(); err != nil && o.err == nil {
				o.err = err
			}
		}
	}
}

func (o *execOutput) writer(stream string) io.Writer {
	if stream == protocol.ReplyStderr {
		return o.stderr
	}
	return o.stdout
}

// Flush completes partial lines (or, in --json mode, writes held-back bytes)
// and returns the first write error.
func (o *execOutput) Flush() error {
	for _, k := range o.partialOrder {
		if p := o.partial[k]; len(p) > 0 && o.err == nil {
			o.err = o.jsonChunk(k[0], k[1], p)
		}
		delete(o.partial, k)
	}
	o.partialOrder = nil
	for _, p := range o.order {
		if err := p.Flush(); err != nil && o.err == nil {
			o.err = err
		}
	}
	return o.err
}
