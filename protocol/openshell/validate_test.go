package openshell_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/protocol/openshell"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"ng-0123456789abcdef", "a", "brave-otter", "0abc", "a-b-c"} {
		if err := openshell.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", ok, err)
		}
	}
	// OS-2: NeMo Gym main's 41-character name, with the gateway's exact text.
	err := openshell.ValidateName("nemo-gym-0123456789abcdef0123456789abcdef")
	if err == nil || err.Error() != "name exceeds maximum length (41 > 19)" {
		t.Errorf("41-char name: got %v", err)
	}
	// OS-4 and other DNS-1123 violations.
	for _, bad := range []string{"", "Ng-1", "ng--1", "-ng1", "ng1-", "ng_1", "ng.1", "ng 1", "ñg", "ng-0123456789abcdef0"} {
		if err := openshell.ValidateName(bad); err == nil {
			t.Errorf("ValidateName(%q) = nil, want error", bad)
		}
	}
}

func TestValidateLabels(t *testing.T) {
	// OS-5.
	good := []map[string]string{
		{"sandbox-api": "openshell-grpc", "nemo-gym.sandbox": "1"},
		{"team": ""},
		{"nemo-gym.nvidia.com/run": "r-1_2.3"},
		{"Team": "A"},
		{strings.Repeat("a", 63): strings.Repeat("b", 63)},
		{"ünïcode": "välue"}, // the gateway's Unicode "alphanumeric"
	}
	for _, m := range good {
		if err := openshell.ValidateLabels(m); err != nil {
			t.Errorf("ValidateLabels(%v) = %v, want nil", m, err)
		}
	}
	bad := []map[string]string{
		{"workload": "configs/x.yaml"},
		{"Team/x": "a"},
		{"": "a"},
		{"-a": "b"},
		{"a": "-b"},
		{"a": "b c"},
		{strings.Repeat("a", 64): "b"},
		{"a": strings.Repeat("b", 64)},
		{"a..b/c": "d"},
		{"-a.b/c": "d"},
		{"a.b-/c": "d"},
		{"a/": "b"},
		{"a/b/c": "d"},
		{strings.Repeat("a", 250) + "/bcd": "e"},
	}
	for _, m := range bad {
		if err := openshell.ValidateLabels(m); err == nil {
			t.Errorf("ValidateLabels(%v) = nil, want error", m)
		}
	}
}

func TestParseLabelSelector(t *testing.T) {
	// OS-6: trim and trailing comma.
	sel, err := openshell.ParseLabelSelector("nemo-gym.sandbox=1, team = a ,")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"nemo-gym.sandbox": "1", "team": "a"}; !maps.Equal(sel, want) {
		t.Fatalf("got %v, want %v", sel, want)
	}
	if !openshell.MatchLabels(sel, map[string]string{"nemo-gym.sandbox": "1", "team": "a", "x": "y"}) {
		t.Error("superset of labels does not match")
	}
	if openshell.MatchLabels(sel, map[string]string{"nemo-gym.sandbox": "1"}) {
		t.Error("missing key matches")
	}
	// Empty value, repeated key, empty selector.
	sel, err = openshell.ParseLabelSelector("team=,a=1,a=2")
	if err != nil || !maps.Equal(sel, map[string]string{"team": "", "a": "2"}) {
		t.Fatalf("got %v, %v", sel, err)
	}
	if openshell.MatchLabels(sel, map[string]string{"a": "2"}) || !openshell.MatchLabels(sel, map[string]string{"a": "2", "team": ""}) {
		t.Error("empty value must match only an empty label value")
	}
	for _, s := range []string{"", " , ,"} {
		sel, err = openshell.ParseLabelSelector(s)
		if err != nil || len(sel) != 0 {
			t.Errorf("ParseLabelSelector(%q) = %v, %v", s, sel, err)
		}
	}
	// 64 pairs are fine (even when keys repeat), 65 are not.
	var pairs []string
	for i := range 64 {
		pairs = append(pairs, fmt.Sprintf("k%d=v", i))
	}
	if _, err := openshell.ParseLabelSelector(strings.Join(pairs, ",")); err != nil {
		t.Errorf("64 pairs: %v", err)
	}
	// OS-7.
	for _, s := range []string{"team", "=a", "a==b", "a!=b", strings.Join(append(pairs, "k64=v"), ","), strings.Repeat("a=1,", 65), "a in (b)", "!a", "Team/x=1"} {
		if _, err := openshell.ParseLabelSelector(s); err == nil {
			t.Errorf("ParseLabelSelector(%.40q) = nil error, want error", s)
		}
	}
}

func TestValidateExecRequest(t *testing.T) {
	ok := &openshell.ExecSandboxRequest{SandboxId: "id", Command: []string{"/bin/sh", "-c", "true"}, Environment: map[string]string{"A_1": "x", "_b": ""}}
	if err := openshell.ValidateExecRequest(ok); err != nil {
		t.Fatal(err)
	}
	bad := []*openshell.ExecSandboxRequest{
		{Command: []string{"true"}},
		{SandboxId: "id"},
		{SandboxId: "id", Command: []string{"true"}, Environment: map[string]string{"1BAD": "x"}}, // OS-12
		{SandboxId: "id", Command: []string{"true"}, Environment: map[string]string{"A-B": "x"}},
		{SandboxId: "id", Command: []string{"true"}, Environment: map[string]string{"": "x"}},
		{SandboxId: "id", Command: []string{"true"}, Environment: map[string]string{"A": strings.Repeat("x", 32<<10+1)}},
		{SandboxId: "id", Command: []string{strings.Repeat("x", 32<<10+1)}},
		{SandboxId: "id", Command: make([]string, 1025)},
		{SandboxId: "id", Command: []string{"true"}, Workdir: strings.Repeat("d", 4097)},
	}
	for i, req := range bad {
		if err := openshell.ValidateExecRequest(req); err == nil {
			t.Errorf("case %d: ValidateExecRequest = nil, want error", i)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	if err := openshell.ValidateSpec(nil); err == nil {
		t.Error("nil spec accepted")
	}
	if err := openshell.ValidateSpec(&openshell.SandboxSpec{Environment: map[string]string{"A": "b"}, Providers: []string{"p"}}); err != nil {
		t.Error(err)
	}
	env := map[string]string{}
	for i := range 129 {
		env[fmt.Sprint("K", i)] = ""
	}
	for i, spec := range []*openshell.SandboxSpec{
		{Environment: env},
		{Environment: map[string]string{"A": strings.Repeat("v", 8193)}},
		{Providers: make([]string, 33)},
		{Template: &openshell.SandboxTemplate{Image: strings.Repeat("i", 1025)}},
	} {
		if err := openshell.ValidateSpec(spec); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
}

func TestListLimitAndWorkspace(t *testing.T) {
	for in, want := range map[uint32]int{0: 100, 1: 1, 1000: 1000, 5000: 1000} {
		if got := openshell.ListLimit(in); got != want {
			t.Errorf("ListLimit(%d) = %d, want %d", in, got, want)
		}
	}
	if openshell.Workspace("") != "default" || openshell.Workspace("w") != "w" {
		t.Error("Workspace defaulting")
	}
}

// TestUnknownFieldsSurvive checks the subset's promise: fields the gateway
// has and we do not declare come back unchanged after decode and encode.
func TestUnknownFieldsSurvive(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, 2, protowire.BytesType) // name
	b = protowire.AppendString(b, "x")
	b = protowire.AppendTag(b, 99, protowire.VarintType) // unknown to us
	b = protowire.AppendVarint(b, 7)
	var req openshell.GetSandboxRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	out, err := proto.Marshal(&req)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(b) {
		t.Fatalf("re-encoded %x, want %x", out, b)
	}
	// A policy's undeclared fields (filesystem=2, ...) survive too.
	var p []byte
	p = protowire.AppendTag(p, 1, protowire.VarintType)
	p = protowire.AppendVarint(p, 1)
	p = protowire.AppendTag(p, 2, protowire.BytesType)
	p = protowire.AppendBytes(p, []byte{0x0a, 0x01, 'x'})
	var pol openshell.SandboxPolicy
	if err := proto.Unmarshal(p, &pol); err != nil || pol.GetVersion() != 1 {
		t.Fatalf("policy: %v %v", pol.GetVersion(), err)
	}
	if out, _ := proto.Marshal(&pol); string(out) != string(p) {
		t.Fatalf("policy re-encoded %x, want %x", out, p)
	}
}

func TestPhaseNames(t *testing.T) {
	// Consumers record the phase verbatim as its enum name.
	if got := openshell.SandboxPhase_SANDBOX_PHASE_DELETING.String(); got != "SANDBOX_PHASE_DELETING" {
		t.Fatal(got)
	}
	if got := openshell.SandboxPhase(4).String(); got != "SANDBOX_PHASE_DELETING" {
		t.Fatal(got)
	}
}
