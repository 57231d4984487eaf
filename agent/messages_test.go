package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// A script whose #! interpreter is missing is reported as bash reports it
// (a bad interpreter, naming it), not as the script itself missing; the
// same on a pty and for a detached job.
func TestMissingInterpreterMessage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	script := filepath.Join(t.TempDir(), "badshebang.sh")
	if err := os.WriteFile(script, []byte("#!/nonexistent/interp -x\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		kind   protocol.Kind
		params any
	}{
		{"exec", protocol.KindExec, protocol.ExecParams{Argv: []string{script}}},
		{"detached", protocol.KindExec, protocol.ExecParams{Argv: []string{script}, Detach: true, JobID: "bad-interp"}},
		{"pty", protocol.KindPTY, protocol.PTYParams{Argv: []string{script}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, tt.kind, tt.params)
			e.finish(t)
			if e.errInfo == nil {
				t.Fatalf("exit %+v, want an error", e.exit)
			}
			msg := e.errInfo.Message
			if e.errInfo.Code != protocol.CodeNotExecutable {
				t.Errorf("code %q, want %q (%s)", e.errInfo.Code, protocol.CodeNotExecutable, msg)
			}
			for _, w := range []string{script, "/nonexistent/interp: bad interpreter", "#!"} {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
		})
	}
}

// The job table's "not found" names the node once (the coordinator puts
// "node N: " in front of what the agent says, after taking the agent's own
// prefix off).
func TestJobNotFoundMessage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpStatus, ID: "nope"})
	if e.errInfo == nil || e.errInfo.Message != `node node-a: no detached job "nope"` {
		t.Errorf("error = %+v, want the message %q", e.errInfo, `node node-a: no detached job "nope"`)
	}
}

// A binary whose dynamic loader is missing is reported naming the loader.
func TestMissingELFInterpreterMessage(t *testing.T) {
	t.Parallel()
	orig := "/bin/true"
	interp := elfInterpreter(orig)
	if interp == "" {
		t.Skip(orig + " has no ELF interpreter")
	}
	b, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(interp+"\x00"))
	bogus := "/no/such/ld"
	if i < 0 || len(bogus) > len(interp) {
		t.Skip("cannot patch the interpreter of " + orig)
	}
	copy(b[i:], bogus+strings.Repeat("\x00", len(interp)-len(bogus)))
	bin := filepath.Join(t.TempDir(), "true")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{bin}})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeNotExecutable || !strings.Contains(e.errInfo.Message, bogus+": bad ELF interpreter") {
		t.Errorf("exit %+v, error %+v; want not_executable naming %s", e.exit, e.errInfo, bogus)
	}
}
