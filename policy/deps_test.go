package policy

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps: policy imports protocol and no other tether package (the
// package doc's rule) but the leaves internal/filetype and internal/yamlerr
// (standard library only), so the coordinator,
// the CLI and later the agent can all use it.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/tetherfleet/tether/"
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, mod) && dep != mod+"policy" && dep != mod+"protocol" && dep != mod+"internal/filetype" && dep != mod+"internal/yamlerr" {
			t.Errorf("policy depends on %s", dep)
		}
	}
}
