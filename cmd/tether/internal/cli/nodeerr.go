package cli

import (
	"fmt"
	"strings"
)

// onNode names node in err once: err as it is when its text names the
// node already ("ssh stream on node N: …", an agent's "node N: …"), else
// "node N: err". Wrapping blindly gave "node vm: ssh stream on node vm:
// …" (issue 13).
func onNode(node string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "node "+node+":") || strings.Contains(msg, " node "+node+":") || strings.Contains(msg, " node "+node+" ") {
		return err
	}
	return fmt.Errorf("node %s: %w", node, err)
}
