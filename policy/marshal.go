package policy

import (
	"bytes"

	"go.yaml.in/yaml/v3"
)

// Marshal returns the policy as YAML in canonical form: keys in the order
// of the package doc, identities and roles sorted, lists in flow style,
// paths cleaned, no comments. Parsing the result gives a policy that
// decides the same and marshals to the same bytes.
func (p *Policy) Marshal() []byte {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	// The document is made of strings, numbers, lists and maps only: the
	// encoder cannot fail on it.
	if err := enc.Encode(p.doc); err != nil {
		panic("policy: marshal: " + err.Error())
	}
	enc.Close()
	return b.Bytes()
}
