package agent

import (
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// sandboxOp runs one sandbox stream and returns its answer.
func (h *harness) sandboxOp(t *testing.T, p protocol.SandboxOpParams) (*protocol.SandboxOpResult, *protocol.ErrorInfo) {
	t.Helper()
	e := h.open(t, protocol.KindSandbox, p)
	f, err := e.fr.Next()
	if err != nil {
		t.Fatalf("sandbox op %+v: read answer: %v", p, err)
	}
	switch f.Type {
	case protocol.FrameSandboxOp:
		var res protocol.SandboxOpResult
		if err := protocol.DecodeJSON(f.Payload, &res); err != nil {
			t.Fatal(err)
		}
		return &res, nil
	case protocol.FrameError:
		var info protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &info); err != nil {
			t.Fatal(err)
		}
		return nil, &info
	}
	t.Fatalf("sandbox op: %s frame, want sandbox-op or error", f.Type)
	return nil, nil
}

func TestSandboxOpDelete(t *testing.T) {
	t.Parallel()
	shell, shellAddr := startOpenShell(t, openshelltest.Options{Token: "shell-token"})
	shell.AddWorkspace("team-a")
	createOpenShell(t, shell, "team-a", "sb-1", nil)
	osb := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: "key"})
	id := createOpenSandbox(t, osb, "key", nil)
	h := newHarness(t, func(c *Config) {
		c.OpenShell = &OpenShellTarget{Addr: shellAddr, Token: "shell-token"}
		c.OpenSandbox = &OpenSandboxTarget{Addr: osb.Host(), APIKey: "key"}
	})
	shellOp := protocol.SandboxOpParams{Op: protocol.SandboxOpDelete, Provider: protocol.ProviderOpenShell, Workspace: "team-a", Name: "sb-1"}
	sandboxOp := protocol.SandboxOpParams{Op: protocol.SandboxOpDelete, Provider: protocol.ProviderOpenSandbox, ID: id}
	for _, tt := range []struct {
		name string
		p    protocol.SandboxOpParams
		want protocol.SandboxOpResult
	}{
		{"openshell delete", shellOp, protocol.SandboxOpResult{Deleted: true}},
		{"openshell again", shellOp, protocol.SandboxOpResult{NotFound: true}},
		{"opensandbox delete", sandboxOp, protocol.SandboxOpResult{Deleted: true}},
		{"opensandbox again", sandboxOp, protocol.SandboxOpResult{NotFound: true}},
	} {
		res, info := h.sandboxOp(t, tt.p)
		if info != nil {
			t.Errorf("%s: error %v", tt.name, info)
			continue
		}
		if diff := cmp.Diff(&tt.want, res); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	if _, ok := shell.Sandbox("team-a", "sb-1"); ok {
		t.Error("the OpenShell sandbox is still there")
	}
	if _, ok := osb.Sandbox(id); ok {
		t.Error("the OpenSandbox sandbox is still there")
	}
}

func TestSandboxOpErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, shellAddr := startOpenShell(t, openshelltest.Options{Token: "right"})
	h := newHarness(t, func(c *Config) {
		c.OpenShell = &OpenShellTarget{Addr: shellAddr, Token: "wrong"}
		c.OpenSandbox = &OpenSandboxTarget{Addr: closed}
	})
	none := newHarness(t, nil)
	for _, tt := range []struct {
		name      string
		h         *harness
		p         protocol.SandboxOpParams
		code, msg string // msg: a substring
	}{
		{"no gateway", none, protocol.SandboxOpParams{Op: "delete", Provider: "opensandbox", ID: "x"},
			protocol.CodeUnknownTarget, "node node-a has no opensandbox gateway"},
		{"bad op", h, protocol.SandboxOpParams{Op: "stop", Provider: "opensandbox", ID: "x"},
			protocol.CodeBadRequest, `node node-a: sandbox op "stop": want "delete"`},
		{"unreachable", h, protocol.SandboxOpParams{Op: "delete", Provider: "opensandbox", ID: "x"},
			protocol.CodeDialFailed, "node node-a: delete opensandbox sandbox x: gateway at " + closed + " unreachable: "},
		{"gateway refuses", h, protocol.SandboxOpParams{Op: "delete", Provider: "openshell", Name: "sb"},
			protocol.CodeInternal, `node node-a: delete openshell sandbox "sb" in workspace "": `},
	} {
		res, info := tt.h.sandboxOp(t, tt.p)
		if info == nil {
			t.Errorf("%s: result %+v, want error %s", tt.name, res, tt.code)
			continue
		}
		if info.Code != tt.code || !strings.Contains(info.Message, tt.msg) {
			t.Errorf("%s: error %v, want %s containing %q", tt.name, info, tt.code, tt.msg)
		}
		if strings.Contains(info.Message, "wrong") {
			t.Errorf("%s: message shows the token: %q", tt.name, info.Message)
		}
	}
}
