package cli

import (
	"bytes"
	"encoding/json"
	"io"

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
	err            error
}

func newExecOutput(stdout, stderr io.Writer, prefix, asJSON bool) *execOutput {
	o := &execOutput{stdout: stdout, stderr: stderr, prefix: prefix, prefixers: map[[2]string]*linePrefixer{}}
	if asJSON {
		o.json = json.NewEncoder(stdout)
	}
	return o
}

// outputLine is one output chunk in --json mode.
type outputLine struct {
	Node   string `json:"node"`
	Stream string `json:"stream"`
	Data   string `json:"data"`
}

// handle is the client.OutputHandler.
func (o *execOutput) handle(node, stream string, data []byte) {
	if o.err != nil {
		return
	}
	switch {
	case o.json != nil:
		o.err = o.json.Encode(outputLine{Node: node, Stream: stream, Data: string(data)})
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
		_, o.err = o.writer(stream).Write(data)
	}
}

func (o *execOutput) writer(stream string) io.Writer {
	if stream == protocol.ReplyStderr {
		return o.stderr
	}
	return o.stdout
}

// Flush completes partial lines and returns the first write error.
func (o *execOutput) Flush() error {
	for _, p := range o.order {
		if err := p.Flush(); err != nil && o.err == nil {
			o.err = err
		}
	}
	return o.err
}
