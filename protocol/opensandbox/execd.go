package opensandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// execd's command API (wire-facts §2.6): POST /command answers with a
// text/event-stream of CommandEvent objects.

// execd paths relative to an execd base URL.
const (
	PingPath    = "/ping"
	CommandPath = "/command"
)

// CommandRequest is the body of POST /command.
type CommandRequest struct {
	// Command is a shell command line (required).
	Command string `json:"command"`
	Cwd     string `json:"cwd,omitempty"`
	// Background returns after the init event; poll
	// /command/status/<id> for the outcome.
	Background bool `json:"background,omitempty"`
	// Timeout is in MILLISECONDS; 0 (omitted) means no server timeout.
	Timeout int64 `json:"timeout,omitempty"`
	// UID and GID run the command as that user and group (GID needs UID).
	UID  *int              `json:"uid,omitempty"`
	GID  *int              `json:"gid,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
}

// Command event types (CommandEvent.Type).
const (
	EventInit              = "init" // Text = command id
	EventStatus            = "status"
	EventError             = "error"  // Error
	EventStdout            = "stdout" // Text = one line without its terminator
	EventStderr            = "stderr" // Text = one line without its terminator
	EventResult            = "result"
	EventExecutionComplete = "execution_complete" // ExecutionTime
	EventExecutionCount    = "execution_count"
	EventPing              = "ping"
)

// CommandExecErrorName is CommandError.EName for a command that ran and
// failed (EValue = the exit code in decimal) or could not start (EValue =
// the error text).
const CommandExecErrorName = "CommandExecError"

// CommandEvent is one server-sent event of POST /command. A foreground
// command yields init, then one stdout/stderr event per output line, then
// execution_complete (exit 0) or error (otherwise).
type CommandEvent struct {
	Type           string `json:"type"`
	Text           string `json:"text,omitempty"`
	ExecutionCount *int   `json:"execution_count,omitempty"`
	// ExecutionTime is the command's run time in milliseconds.
	ExecutionTime int64 `json:"execution_time,omitempty"`
	// Timestamp is the event time in milliseconds since the Unix epoch.
	Timestamp int64           `json:"timestamp,omitempty"`
	Results   json.RawMessage `json:"results,omitempty"`
	Error     *CommandError   `json:"error,omitempty"`
}

// CommandError is the error of an error event, e.g.
// {"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}.
type CommandError struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// WriteCommandEvent writes ev as execd does: the bare JSON object followed
// by a blank line (no "data:" prefix).
func WriteCommandEvent(w io.Writer, ev CommandEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("opensandbox: encode %s event: %w", ev.Type, err)
	}
	b = append(b, '\n', '\n')
	_, err = w.Write(b)
	return err
}

// MaxEventLine bounds one line of an event stream, in bytes.
const MaxEventLine = 4 << 20

// ErrEventTooLarge is returned by CommandEventReader.Next for a line over
// MaxEventLine.
var ErrEventTooLarge = errors.New("opensandbox: event line too large")

// CommandEventReader reads CommandEvents from a /command response body the
// way the SDKs do: each non-blank line is one JSON object, bare or after a
// "data:" prefix; comment lines (":...") and "event:", "id:", "retry:"
// lines are skipped.
type CommandEventReader struct {
	r *bufio.Reader
}

// NewCommandEventReader reads events from r.
func NewCommandEventReader(r io.Reader) *CommandEventReader {
	return &CommandEventReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next event, io.EOF at the end of the stream, or an error
// for an oversized line or a line that is not a JSON object.
func (er *CommandEventReader) Next() (CommandEvent, error) {
	for {
		line, err := er.readLine()
		if err != nil {
			return CommandEvent{}, err
		}
		line = bytes.TrimSpace(line)
		switch {
		case len(line) == 0, line[0] == ':',
			bytes.HasPrefix(line, []byte("event:")), bytes.HasPrefix(line, []byte("id:")), bytes.HasPrefix(line, []byte("retry:")):
			continue
		}
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimSpace(rest)
		}
		var ev CommandEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return CommandEvent{}, fmt.Errorf("opensandbox: command event %q: %w", truncate(line, 80), err)
		}
		return ev, nil
	}
}

// readLine returns one line without its terminator; a final line without
// one is returned before io.EOF.
func (er *CommandEventReader) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := er.r.ReadSlice('\n')
		if len(line)+len(chunk) > MaxEventLine {
			return nil, ErrEventTooLarge
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimRight(line, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return line, nil
		default:
			return nil, err
		}
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
