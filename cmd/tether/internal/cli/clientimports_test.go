package cli

import (
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// TestClientFilesImportNoDaemon: the files of the client commands import
// neither the coordinator nor the agent (nor their sub-packages). The full
// binary links the daemons anyway; this keeps the client's code from
// depending on daemon internals (a constant the client needs lives in
// protocol), which is what lets the client-only build (-tags tetherclient,
// build_client.go) compile these files without the daemons (issue 12;
// cmd/tether's TestClientBuildLinksNoDaemon checks what it links).
func TestClientFilesImportNoDaemon(t *testing.T) {
	clientFiles := []string{
		"cp.go", "exec.go", "filterflags.go", "forward.go", "job.go", "natsopts.go", "node.go", "nodeerr.go",
		"nodes.go", "output.go", "progress.go", "shell.go", "ssh.go", "token.go",
	}
	const mod = "github.com/tetherfleet/tether/"
	fset := token.NewFileSet()
	for _, name := range clientFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			rel, ok := strings.CutPrefix(path, mod)
			if !ok {
				continue
			}
			if top, _, _ := strings.Cut(rel, "/"); top == "coordinator" || top == "agent" {
				t.Errorf("%s imports %s: a client command must not need a daemon package (move what it uses to protocol, client or natsauth)", name, path)
			}
		}
	}
}
