package cli

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/tetherfleet/tether/protocol"
)

// progressInterval bounds how often the progress line is redrawn.
const progressInterval = 100 * time.Millisecond

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress draws a live "12/1000 done · 3 failed · 64 running" line on a
// terminal (stderr) while a fan-out job runs. Output lines go through its
// writers, which clear the line before writing so that the two never
// interleave; a ticker redraws it at most every progressInterval.
//
// Its goroutine (the ticker) is started by start and ended by stop. All
// writes to the terminal take mu.
type progress struct {
	mu      sync.Mutex
	w       io.Writer // the terminal
	total   int       // nodes targeted; 0 if unknown
	maxPar  int       // nodes run at once
	done    int
	failed  int
	shown   bool // the line is on screen
	dirty   bool // counts changed since the last draw
	stopped bool

	quit chan struct{}
	wg   sync.WaitGroup
}

func newProgress(w io.Writer, total, maxParallel int) *progress {
	return &progress{w: w, total: total, maxPar: maxParallel, quit: make(chan struct{}), dirty: true}
}

// start starts the redraw ticker.
func (p *progress) start() {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				p.mu.Lock()
				if p.dirty && !p.stopped {
					p.drawLocked()
				}
				p.mu.Unlock()
			}
		}
	}()
}

// stop ends the ticker and clears the line for good.
func (p *progress) stop() {
	close(p.quit)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	p.stopped = true
}

// nodeDone counts one finished node.
func (p *progress) nodeDone(ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if !ok {
		p.failed++
	}
	p.dirty = true
}

// line renders the progress line.
func (p *progress) line() string {
	running := p.maxPar
	if p.total > 0 {
		running = min(p.total-p.done, p.maxPar)
	}
	total := "?"
	if p.total > 0 {
		total = fmt.Sprint(p.total)
	}
	return fmt.Sprintf("%d/%s done · %d failed · %d running", p.done, total, p.failed, max(running, 0))
}

func (p *progress) drawLocked() {
	fmt.Fprintf(p.w, "\r\033[K%s", p.line())
	p.shown = true
	p.dirty = false
}

func (p *progress) clearLocked() {
	if p.shown {
		io.WriteString(p.w, "\r\033[K")
		p.shown = false
		p.dirty = true
	}
}

// writer returns a writer that clears the progress line before each write
// to w (which shares the terminal).
func (p *progress) writer(w io.Writer) io.Writer { return &progressWriter{p: p, w: w} }

type progressWriter struct {
	p *progress
	w io.Writer
}

func (pw *progressWriter) Write(b []byte) (int, error) {
	pw.p.mu.Lock()
	defer pw.p.mu.Unlock()
	pw.p.clearLocked()
	return pw.w.Write(b)
}

// firstLine returns s up to its first newline.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// writeSummary prints the table of a fan-out job's failed nodes and those
// whose output was truncated (every node when all is set) and the totals
// line. cancelCode is the EXIT of a cancelled node (nodeOutcome's 130):
// the client's interrupt code (130, or 143 after SIGTERM) when the client
// was interrupted, as `--node` then exits with it.
func writeSummary(w io.Writer, res *protocol.ExecResult, timeout time.Duration, all bool, elapsed time.Duration, cancelCode int) error {
	rows := make([]protocol.NodeResult, 0, len(res.Results))
	failed, truncated := 0, 0
	for _, r := range res.Results {
		ok := r.OK()
		if !ok {
			failed++
		}
		if r.OutputTruncated() {
			truncated++
		}
		if all || !ok || r.OutputTruncated() {
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Node < rows[j].Node })
	if len(rows) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tEXIT\tDURATION\tRESULT")
		for i := range rows {
			r := &rows[i]
			d := time.Duration(r.DurationMS * float64(time.Millisecond)).Round(time.Millisecond)
			// EXIT is the code `--node` would exit with (127 for a command
			// not found, 124 for a timeout, 255 when Tether failed), not
			// the raw result's -1 for "no exit status".
			code, _ := nodeOutcome(r, timeout)
			if r.Cancelled && code == exitInterrupted {
				code = cancelCode // not a command's own exit 130
			}
			// printable: the node's id, error and stderr line are the
			// agent's and the command's words.
			writeRow(tw, r.Node, strconv.Itoa(code), d.String(), summaryText(r, timeout))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	n := len(res.Results)
	noun := "nodes"
	if n == 1 {
		noun = "node"
	}
	trunc := ""
	if truncated > 0 {
		trunc = fmt.Sprintf(", %d with output truncated", truncated)
	}
	verb := "succeeded"
	if n > 0 && n-failed > 0 && allDetached(res.Results) {
		verb = "started" // a detached job's nodes report its start, not its end
	}
	_, err := fmt.Fprintf(w, "%d %s: %d %s, %d failed%s (%v)\n", n, noun, n-failed, verb, failed, trunc, elapsed.Round(time.Millisecond))
	return err
}

// allDetached reports whether every result that is OK is a detached
// job's start.
func allDetached(rs []protocol.NodeResult) bool {
	for i := range rs {
		if rs[i].OK() && !rs[i].Detached {
			return false
		}
	}
	return true
}

// summaryText is a node's RESULT column: ok, or the first line of what went
// wrong.
func summaryText(r *protocol.NodeResult, timeout time.Duration) string {
	if r.OK() {
		switch {
		case r.Detached:
			return "started detached"
		case r.OutputTruncated():
			return "ok, output truncated"
		}
		return "ok"
	}
	if r.Failure != "" && !r.TimedOut {
		// The failure reads "Command failed (…) with exit code N:",
		// "  COMMAND", then stderr: the table shows the exit code and
		// the command, which say more than line one.
		lines := strings.SplitN(r.Failure, "\n", 4)
		text := fmt.Sprintf("exit %d", r.ExitCode)
		if len(lines) > 1 {
			text += ": " + strings.TrimSpace(lines[1])
		}
		// A stderr streamed above the table in full is not repeated
		// here (it would be its second or third copy).
		if len(lines) > 2 && strings.TrimSpace(lines[2]) != "" && !stderrStreamed(r) {
			text += ": " + strings.TrimSpace(lines[2])
		}
		if len(text) > 120 {
			text = text[:117] + "..."
		}
		return text
	}
	_, msg := nodeOutcome(r, timeout)
	return firstLine(msg)
}
