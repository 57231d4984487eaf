package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestQuickstartAsWritten checks what a new user on a fresh machine
// tripped over in the README's quickstart (issue 13): tether was not on
// PATH after `make dev`, the C compiler `make test`'s -race needs was not
// named, nor where the nats CLI comes from; and `make dev` sat silent for
// minutes while it built.
func TestQuickstartAsWritten(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	qs := string(readme)
	i := strings.Index(qs, "\n## Quickstart")
	if i < 0 {
		t.Fatal("README has no Quickstart section")
	}
	qs = qs[i+1:]
	if j := strings.Index(qs[3:], "\n## "); j >= 0 {
		qs = qs[:j+3]
	}
	for _, want := range []string{
		`export PATH="$PWD/bin:$PATH"`, // tether on PATH, or
		"./bin/tether",                 // the path to write without it
		"gcc",                          // -race's C compiler
		"apt-get install -y make gcc",  // the packages, gcc among them
		"go install github.com/nats-io/natscli/nats@", // the nats CLI
	} {
		if !strings.Contains(qs, want) {
			t.Errorf("the quickstart does not say %q", want)
		}
	}

	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make to ask about the dev target")
	}
	out, err := exec.Command("make", "-C", "../..", "-n", "--no-print-directory", "dev").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n dev: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	built, announced := -1, -1
	for k, l := range lines {
		switch {
		case strings.Contains(l, "go build") && strings.Contains(l, " -v "):
			built = k
		case strings.HasPrefix(l, "echo") && strings.Contains(l, "building") && announced < 0:
			announced = k
		}
	}
	if built < 0 || announced < 0 || announced > built {
		t.Errorf("make dev does not announce its build and list packages as they compile (go build -v):\n%s", out)
	}
}
