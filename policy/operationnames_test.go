package policy

import (
	"slices"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// protocol.PolicyOperations, which the CLI checks --operation with, names
// exactly the policy's operations, in order.
func TestOperationNamesInProtocol(t *testing.T) {
	var names []string
	for _, o := range Operations() {
		names = append(names, o.String())
	}
	if got := protocol.PolicyOperations(); !slices.Equal(got, names) {
		t.Errorf("protocol.PolicyOperations() = %q, policy's operations are %q", got, names)
	}
}
