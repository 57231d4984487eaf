package protocol_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

func TestSSHParamsValidate(t *testing.T) {
	good := func() protocol.SSHParams {
		return protocol.SSHParams{
			Session:   "0123456789abcdef0123456789abcdef",
			Identity:  "ssh-key:SHA256:abc",
			Logins:    []string{"deploy"},
			Targets:   []string{"openshell"},
			Auth:      protocol.SSHAuthPublicKey,
			PublicKey: []byte{0, 0, 0, 11},
		}
	}
	if p := good(); p.Validate() != nil {
		t.Fatalf("valid params refused: %v", p.Validate())
	}
	tests := []struct {
		name string
		edit func(*protocol.SSHParams)
		want string
	}{
		{"short session", func(p *protocol.SSHParams) { p.Session = "00" }, "session"},
		{"upper session", func(p *protocol.SSHParams) { p.Session = strings.ToUpper(p.Session) }, "session"},
		{"no identity", func(p *protocol.SSHParams) { p.Identity = "" }, "identity is empty"},
		{"NUL identity", func(p *protocol.SSHParams) { p.Identity = "a\x00" }, "identity contains NUL"},
		{"no logins", func(p *protocol.SSHParams) { p.Logins = nil }, "logins is empty"},
		{"empty login", func(p *protocol.SSHParams) { p.Logins = []string{""} }, "logins[0] is empty"},
		{"bad login", func(p *protocol.SSHParams) { p.Logins = []string{"a/b"} }, "logins[0]: user"},
		{"bad target", func(p *protocol.SSHParams) { p.Targets = []string{"Web"} }, "targets[0]"},
		{"unknown auth", func(p *protocol.SSHParams) { p.Auth = "password" }, "auth"},
		{"publickey without key", func(p *protocol.SSHParams) { p.PublicKey = nil }, "without public_key"},
		{"none with key", func(p *protocol.SSHParams) { p.Auth = protocol.SSHAuthNone }, "auth none with a public_key"},
		{"huge key", func(p *protocol.SSHParams) { p.PublicKey = make([]byte, protocol.MaxSSHKeySize+1) }, "public_key"},
		{"huge cert", func(p *protocol.SSHParams) { p.HostCertificate = make([]byte, protocol.MaxSSHKeySize+1) }, "host_certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := good()
			tt.edit(&p)
			err := p.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error with %q", err, tt.want)
			}
		})
	}
	p := good()
	if !p.AllowsLogin("deploy") || p.AllowsLogin("root") || !p.AllowsTarget("openshell") || p.AllowsTarget("execd") {
		t.Fatal("AllowsLogin/AllowsTarget disagree with the lists")
	}
}
