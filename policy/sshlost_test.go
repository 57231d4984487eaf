package policy

import (
	"strings"
	"testing"
)

// TestSSHGrantLost: a session keeps its grant while the policy grants ssh
// on the node as every login it was given and forwarding to every target;
// each thing taken away is named, and the first found is the reason.
func TestSSHGrantLost(t *testing.T) {
	const file = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy
      - nodes: "env=staging"
        operations: [ssh]
        run_as: alice
      - nodes: "gpu"
        operations: [forward]
        targets: [openshell]
`
	p := mustParse(t, file)
	for _, tt := range []struct {
		name            string
		node            Node
		logins, targets []string
		want            string
	}{
		{"all still granted", nodeA, []string{"deploy", "alice"}, []string{"openshell"}, ""},
		{"no login asked", nodeA, nil, nil, ""},
		{"ssh gone on the node", nodeB, []string{"deploy"}, nil, "the policy no longer grants ssh on node-b: "},
		{"one login gone", nodeA, []string{"deploy", "root"}, nil, "the policy no longer grants nats:alice ssh on node-a as login root"},
		{"a target gone", nodeA, []string{"deploy"}, []string{"openshell", "opensandbox"}, "the policy no longer grants nats:alice forwarding to opensandbox on node-a"},
		{"forward gone with the label", Node{ID: "node-a", Labels: map[string]string{"env": "staging"}}, nil, []string{"openshell"}, "the policy no longer grants nats:alice forwarding to openshell on node-a"},
	} {
		got := SSHGrantLost(p.Grants, alice, tt.node, tt.logins, tt.targets)
		if tt.want == "" && got != "" || tt.want != "" && !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
