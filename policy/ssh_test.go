package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const sshFile = `version: 1
identities:
  ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU:
    rules:
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy
      - nodes: "*"
        operations: [ssh]
        run_as: nobody
      - nodes: "*"
        operations: [forward]
        targets: [openshell, web]
  ssh-principal:alice:
    rules:
      - nodes: "gpu"
        operations: [ssh]
        run_as: alice
  ssh-principal:ops:
    rules:
      - nodes: "*"
        operations: [ssh]
        run_as: root
`

func TestSSHIdentitiesAndGrants(t *testing.T) {
	p := mustParse(t, sshFile)
	key := Identity{Kind: KindSSHKey, Name: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"}
	staging := Node{ID: "n1", Labels: map[string]string{"env": "staging"}}
	prod := Node{ID: "n2", Labels: map[string]string{"env": "prod"}}

	gs, err := p.Grants(key, OpSSH, staging)
	if err != nil {
		t.Fatal(err)
	}
	var logins []string
	for _, g := range gs {
		logins = append(logins, g.RunAs)
	}
	if !slices.Equal(logins, []string{"deploy", "nobody"}) {
		t.Errorf("logins on staging = %v, want [deploy nobody] in rule order", logins)
	}
	if gs, err := p.Grants(key, OpSSH, prod); err != nil || len(gs) != 1 || gs[0].RunAs != "nobody" {
		t.Errorf("logins on prod = %+v, %v; want [nobody]", gs, err)
	}
	if gs, err := p.Grants(key, OpForward, prod); err != nil || len(gs) != 1 || !slices.Equal(gs[0].Targets, []string{"openshell", "web"}) {
		t.Errorf("forward grants = %+v, %v", gs, err)
	}

	// A certificate caller matches the entries of every principal.
	cert := Identity{Kind: KindSSHPrincipal, Name: "bob", Principals: []string{"bob", "alice", "ops"}}
	gpu := Node{ID: "g1", Labels: map[string]string{"gpu": ""}}
	gs, err = p.Grants(cert, OpSSH, gpu)
	if err != nil {
		t.Fatal(err)
	}
	logins = logins[:0]
	for _, g := range gs {
		logins = append(logins, g.RunAs)
	}
	if !slices.Equal(logins, []string{"alice", "root"}) {
		t.Errorf("certificate logins = %v, want [alice root]", logins)
	}
	if cert.String() != "ssh-principal:bob" {
		t.Errorf("certificate caller is named %s", cert)
	}

	// Refusals name the identity, the operation and the node.
	stranger := Identity{Kind: KindSSHPrincipal, Name: "eve", Principals: []string{"eve", "mallory"}}
	_, err = p.Grants(stranger, OpSSH, gpu)
	var r *Refusal
	if !errors.As(err, &r) || r.Reason != ReasonNoIdentity || !strings.Contains(err.Error(), "ssh-principal:mallory") {
		t.Errorf("stranger: %v", err)
	}
	_, err = p.Grants(Identity{Kind: KindSSHPrincipal, Name: "alice", Principals: []string{"alice"}}, OpSSH, prod)
	if !errors.As(err, &r) || r.Reason != ReasonNoRule || !strings.Contains(err.Error(), "ssh") || !strings.Contains(err.Error(), "n2") {
		t.Errorf("alice on prod: %v", err)
	}
	if _, err := p.Grants(key, OpCopyRead, staging); !errors.As(err, &r) || r.Reason != ReasonBadRequest {
		t.Errorf("Grants of cp.read: %v, want bad_request", err)
	}
	// Decide agrees with the first grant.
	if g, err := p.Decide(key, OpSSH, staging, Object{}); err != nil || g.RunAs != "deploy" {
		t.Errorf("Decide = %+v, %v", g, err)
	}
	if !cert.owns("ssh-principal:alice") || cert.owns("ssh-principal:eve") || key.owns("ssh-key:SHA256:other") {
		t.Error("owns disagrees with the principals")
	}
}

func TestSSHEntryKeys(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want string // "" = valid
	}{
		{"ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU", ""},
		{"ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFV", "bad last character"},
		{"ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuF", "43 base64"},
		{"ssh-key:MD5:aa:bb", "want SHA256:"},
		{"ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSu-U", "not base64"},
		{"ssh-principal:alice@example.com", ""},
		{"ssh-principal:-x", "must start with a letter or digit"},
		{"ssh-principal:" + strings.Repeat("a", 129), "over 128"},
	} {
		_, err := parseEntryKey(tt.key)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.key, err, tt.want)
		}
	}
	// ssh needs nodes and run_as, as exec does.
	_, err := Parse("p.yaml", []byte("version: 1\nidentities:\n  ssh-principal:a:\n    rules:\n      - operations: [ssh]\n"))
	if err == nil || !strings.Contains(err.Error(), "run_as") || !strings.Contains(err.Error(), "nodes") {
		t.Errorf("ssh without nodes and run_as: %v", err)
	}
}
