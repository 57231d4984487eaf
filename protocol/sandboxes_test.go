package protocol_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

func TestValidRunID(t *testing.T) {
	for _, ok := range []string{"a", "0", "run-1", "r_1.2-x", "0123456789ab", strings.Repeat("r", protocol.MaxRunIDLen)} {
		if err := protocol.ValidRunID(ok); err != nil {
			t.Errorf("ValidRunID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", ".a", "_a", "a/b", "a b", "a*", "é", strings.Repeat("r", protocol.MaxRunIDLen+1)} {
		if err := protocol.ValidRunID(bad); err == nil {
			t.Errorf("ValidRunID(%q) accepted", bad)
		}
	}
}

// TestSandboxRequests decodes and validates request bodies the way the
// coordinator does.
func TestSandboxRequests(t *testing.T) {
	type validator interface{ Validate() *protocol.APIError }
	tests := []struct {
		name string
		v    func() validator
		body string
		code string // "" = valid
	}{
		{"open", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r1","ttl_ms":60000,"holder":"h:1"}`, ""},
		{"open default ttl", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r1"}`, ""},
		{"open ttl too short", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r1","ttl_ms":999}`, protocol.ErrCodeInvalid},
		{"open ttl too long", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r1","ttl_ms":86400001}`, protocol.ErrCodeInvalid},
		{"open negative ttl", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r1","ttl_ms":-1}`, protocol.ErrCodeInvalid},
		{"open no run", func() validator { return &protocol.LeaseOpenRequest{} }, `{}`, protocol.ErrCodeInvalid},
		{"open long holder", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r","holder":"` + strings.Repeat("h", 257) + `"}`, protocol.ErrCodeInvalid},
		{"open unknown field", func() validator { return &protocol.LeaseOpenRequest{} }, `{"run":"r","ttl":5}`, protocol.ErrCodeUnknownField},
		{"renew", func() validator { return &protocol.LeaseRequest{} }, `{"run":"r1"}`, ""},
		{"renew bad run", func() validator { return &protocol.LeaseRequest{} }, `{"run":"r 1"}`, protocol.ErrCodeInvalid},
		{"list empty", func() validator { return &protocol.SandboxesListRequest{} }, ``, ""},
		{"list filters", func() validator { return &protocol.SandboxesListRequest{} }, `{"run":"r","node":"n","state":"leaked","provider":"opensandbox","limit":1000,"after":"x"}`, ""},
		{"list bad state", func() validator { return &protocol.SandboxesListRequest{} }, `{"state":"gone"}`, protocol.ErrCodeInvalid},
		{"list bad provider", func() validator { return &protocol.SandboxesListRequest{} }, `{"provider":"docker"}`, protocol.ErrCodeInvalid},
		{"list limit", func() validator { return &protocol.SandboxesListRequest{} }, `{"limit":1001}`, protocol.ErrCodeInvalid},
		{"register", func() validator { return &protocol.SandboxRegisterRequest{} },
			`{"provider":"openshell","node":"n1","id":"u","name":"sb","workspace":"default","run":"r","ttl_ms":1000,"labels":{"a":"b"}}`, ""},
		{"register opensandbox", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"opensandbox","node":"n1","id":"u"}`, ""},
		{"register openshell without name", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"openshell","node":"n1","id":"u"}`, protocol.ErrCodeInvalid},
		{"register no id", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"opensandbox","node":"n1"}`, protocol.ErrCodeInvalid},
		{"register bad node", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"opensandbox","node":"-n","id":"u"}`, protocol.ErrCodeInvalid},
		{"register bad run", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"opensandbox","node":"n","id":"u","run":"a/b"}`, protocol.ErrCodeInvalid},
		{"register negative ttl", func() validator { return &protocol.SandboxRegisterRequest{} }, `{"provider":"opensandbox","node":"n","id":"u","ttl_ms":-5}`, protocol.ErrCodeInvalid},
		{"reap run", func() validator { return &protocol.ReapRequest{} }, `{"run":"r"}`, ""},
		{"reap dry run all", func() validator { return &protocol.ReapRequest{} }, `{"dry_run":true}`, ""},
		{"reap all", func() validator { return &protocol.ReapRequest{} }, `{}`, protocol.ErrCodeInvalid},
		{"reap bad run", func() validator { return &protocol.ReapRequest{} }, `{"run":"-r","dry_run":true}`, protocol.ErrCodeInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.v()
			e := protocol.DecodeRequest([]byte(tc.body), v)
			if e == nil {
				e = v.Validate()
			}
			switch {
			case tc.code == "" && e != nil:
				t.Errorf("rejected: %v", e)
			case tc.code != "" && e == nil:
				t.Errorf("accepted, want %s", tc.code)
			case tc.code != "" && e.Code != tc.code:
				t.Errorf("code %s (%v), want %s", e.Code, e, tc.code)
			}
		})
	}
}

// TestSandboxInfoJSON pins the record's JSON: the ledger stores it in KV,
// so its field names are a format other coordinators read.
func TestSandboxInfoJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	info := protocol.SandboxInfo{Provider: "openshell", Node: "n1", ID: "u", Name: "sb", Workspace: "default", Run: "r",
		Labels: map[string]string{"nemo-gym.sandbox": "1"}, Managed: true, CreatedAt: at, FirstSeen: at, LastSeen: at,
		TTLMS: 1000, State: protocol.SandboxLive, StateSince: at, Source: protocol.SourceInventory}
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"provider":"openshell","node":"n1","id":"u","name":"sb","workspace":"default","run":"r","labels":{"nemo-gym.sandbox":"1"},"managed":true,` +
		`"created_at":"2026-01-02T03:04:05Z","first_seen":"2026-01-02T03:04:05Z","last_seen":"2026-01-02T03:04:05Z","ttl_ms":1000,"state":"live",` +
		`"state_since":"2026-01-02T03:04:05Z","source":"inventory"}`
	if string(b) != want {
		t.Errorf("JSON =\n%s\nwant\n%s", b, want)
	}
	var back protocol.SandboxInfo
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.ExpiresAt != (time.Time{}) || back.Provider != "openshell" || !back.StateSince.Equal(at) {
		t.Errorf("round trip = %+v", back)
	}
	for _, s := range []string{"live", "deleting", "deleted", "lost", "leaked"} {
		if !protocol.ValidSandboxState(s) {
			t.Errorf("ValidSandboxState(%q) = false", s)
		}
	}
	if protocol.ValidSandboxState("") {
		t.Error(`ValidSandboxState("") = true`)
	}
}

func TestBoundLabels(t *testing.T) {
	small := map[string]string{"a": "b"}
	if got, cut := protocol.BoundLabels(small, nil); cut || len(got) != 1 {
		t.Errorf("labels within bounds: %v, cut %v", got, cut)
	}
	in := map[string]string{"z-keep": "1", "long-key-" + strings.Repeat("k", protocol.MaxLabelKeyLen): "x", "clip": strings.Repeat("ü", 200)}
	for i := range 100 {
		in[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 100)
	}
	got, cut := protocol.BoundLabels(in, []string{"missing", "z-keep"})
	size := 0
	for k, v := range got {
		size += len(k) + len(v)
		if len(k) > protocol.MaxLabelKeyLen || len(v) > protocol.MaxLabelValueLen {
			t.Errorf("label %.20s… = %.20s… over the bounds", k, v)
		}
	}
	if !cut || got["z-keep"] != "1" || got["k000"] == "" || len(got) > protocol.MaxRecordLabels || size > protocol.MaxRecordLabelBytes {
		t.Errorf("bounded: cut %v, %d labels, %d bytes, z-keep %q", cut, len(got), size, got["z-keep"])
	}
	if v := got["clip"]; len(v) != 256 || v != strings.Repeat("ü", 128) {
		t.Errorf("clipped value is %d bytes, not at a rune boundary or not a prefix", len(v))
	}
	if len(in) != 103 {
		t.Error("BoundLabels changed its argument")
	}
}

func TestRegisterRefusesOddNames(t *testing.T) {
	for _, r := range []protocol.SandboxRegisterRequest{
		{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "x1", Name: "x\ny"},
		{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "x1", Name: "ok", Workspace: "../w"},
		{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "a/b?c=d#e"},
		{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "a b"},
	} {
		if e := r.Validate(); e == nil || e.Code != protocol.ErrCodeInvalid {
			t.Errorf("%+v: %v, want invalid_request", r, e)
		}
	}
	ok := protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "6f1c0e9a-1b2c-4d5e-8f90-123456789abc", Name: "ng-0123456789abcdef", Workspace: "default"}
	if e := ok.Validate(); e != nil {
		t.Errorf("a valid registration: %v", e)
	}
}
