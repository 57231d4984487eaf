package policy

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps: policy imports protocol and no other tether package (the
// package doc's rule) but the leaves internal/filetype, internal/yamlerr
// (standard library only) and internal/identity (protocol and nkeys), so the coordinator,
// the CLI and later the agent can all use it.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/tetherfleet/tether/"
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, mod) && dep != mod+"policy" && dep != mod+"protocol" && dep != mod+"internal/filetype" && dep != mod+"internal/yamlerr" && dep != mod+"internal/identity" {
			t.Errorf("policy depends on %s", dep)
		}
	}
}
