package coordinator

import (
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// A job record's command (tether job list, the console's job pages) is an
// argv as a shell would take it back: each argument that is not one plain
// word single-quoted, not Go's [a b c] slice syntax, which cannot tell
// `sh -c 'a b'` from `sh -c a b`.
// A batch is its commands a line each.
func TestJobCommandQuotesArgv(t *testing.T) {
	for _, tt := range []struct {
		p    protocol.ExecParams
		want string
	}{
		{protocol.ExecParams{Argv: []string{"uname", "-a"}}, "uname -a"},
		{protocol.ExecParams{Argv: []string{"sh", "-c", "echo out; exit 3"}}, "sh -c 'echo out; exit 3'"},
		{protocol.ExecParams{Argv: []string{"echo", "it's", ""}}, `echo 'it'\''s' ''`},
		{protocol.ExecParams{Argv: []string{"ls", "/srv/app", "a=b,c:d@e+f%"}}, "ls /srv/app a=b,c:d@e+f%"},
		{protocol.ExecParams{Script: "make test\n"}, "make test\n"},
		{protocol.ExecParams{Commands: []string{"make deps", "make test"}}, "make deps\nmake test"}, // a line each; jobstore marks the lines it leaves out
	} {
		j := &job{params: tt.p}
		if got := j.command(); got != tt.want {
			t.Errorf("command of %+v = %q, want %q", tt.p, got, tt.want)
		}
	}
}
