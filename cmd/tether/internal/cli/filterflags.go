package cli

import (
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/internal/identity"
	"github.com/tetherfleet/tether/protocol"
)

// The filters that `tether job list` and `tether audit` share, each read
// by one rule: the commands refuse the same values the same way (a usage
// error naming the flag, before anything is sent).

// identityFilter returns the identity that flag's value s names, as job
// owners and audit events record it: KIND:NAME, a bare NAME (no colon)
// being the NATS user nats:NAME. "" stays "" (no filter). A value no
// caller can have is refused by identity.CheckCaller's rule (a policy's identities entries), naming flag
// and the first bad character: it would match nothing, silently.
func identityFilter(flag, s string) (string, error) {
	if s == "" {
		return "", nil
	}
	id := s
	if !strings.Contains(id, ":") {
		id = identity.NATS + ":" + id
	}
	if err := identity.CheckCaller(id); err != nil {
		return "", fmt.Errorf("%s %q: %w", flag, s, err)
	}
	return id, nil
}

// nodeFilter checks a --node filter by the node id rule
// (protocol.ValidNodeID); "" is no filter.
func nodeFilter(node string) error {
	if node == "" {
		return nil
	}
	if err := protocol.ValidNodeID(node); err != nil {
		return fmt.Errorf("--node: %w", err)
	}
	return nil
}

// limitFlag checks --limit n against a command's maximum: 1 to max. 0 is
// refused, not read as the default nor as "no limit": the flag's default
// is in its help, and "at most 0" is not a request a user means.
func limitFlag(n, max int) error {
	if n < 1 || n > max {
		return fmt.Errorf("--limit %d: want 1 to %d", n, max)
	}
	return nil
}
