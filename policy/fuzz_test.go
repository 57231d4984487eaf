package policy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzParse: Parse never panics; a policy it accepts marshals to YAML that
// parses to the same policy and marshals to the same bytes, and Decide
// answers every operation without panicking.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("..", "deploy", "policy.example.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(example),
		decideFile,
		"version: 1\nidentities: {}\n",
		"version: 1\ndefaults: {limits: {requests_per_second: 0.5, burst: 1}}\nidentities: {\"cert:a b\": {}}\n",
		"version: 1\nroles: {a: [{operations: [admin]}]}\nidentities: {token:x: {roles: [a]}}\n",
		"version: 1\nidentities:\n  nats:alice:\n    rules:\n      - nodes: \"!spot,zone in (a,b)\"\n        operations: [cp.write]\n        paths: [/, /a//b/./]\n        run_as: _x\n",
		"version: 1\nroles:\n  a: &r\n    - operations: [admin]\n  b: *r\nidentities: {}\n",
		"version: 1\nidentities: {nats:alice: {<<: {}}}\n",
	} {
		f.Add([]byte(s))
	}
	ignore := cmpopts.IgnoreUnexported(fileDoc{}, fileDefaults{}, fileLimits{}, fileEntry{}, fileRule{})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		out := p.Marshal()
		q, err := Parse("f.yaml", out)
		if err != nil {
			t.Fatalf("the marshalled policy does not parse: %v\ninput:\n%s\nmarshalled:\n%s", err, data, out)
		}
		if d := cmp.Diff(p.doc, q.doc, ignore, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip changed the policy (-first +second):\n%s", d)
		}
		if again := q.Marshal(); !bytes.Equal(out, again) {
			t.Fatalf("marshal is not a fixed point:\n%s\nthen\n%s", out, again)
		}
		node := Node{ID: "n", Labels: map[string]string{"env": "prod", "gpu": "true"}}
		for key, e := range p.doc.Identities {
			id := Identity{Kind: e.key.kind, Name: e.key.value, Account: e.key.value}
			if e.key.kind == KindNATSAccount {
				id = Identity{Kind: KindNATS, Name: "u", Account: e.key.value}
			}
			for _, op := range Operations() {
				g1, err1 := p.Decide(id, op, node, Object{Path: "/a/b", Target: "openshell", Owner: key})
				g2, err2 := q.Decide(id, op, node, Object{Path: "/a/b", Target: "openshell", Owner: key})
				if (err1 == nil) != (err2 == nil) || g1.RunAs != g2.RunAs {
					t.Fatalf("%s %s: %v %v, after the round trip %v %v", key, op, g1, err1, g2, err2)
				}
			}
			p.Limits(id)
		}
	})
}
