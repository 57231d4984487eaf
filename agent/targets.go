package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// Defaults of the dial and inventory streams.
const (
	DefaultMaxDials         = 1024
	DefaultDialTimeout      = 10 * time.Second
	DefaultInventoryTimeout = 60 * time.Second
	// DefaultOpenShellWorkspace is the workspace listed when
	// OpenShellTarget.Workspaces is empty.
	DefaultOpenShellWorkspace = "default"
)

// OpenShellTarget is the node's OpenShell gateway (gRPC service
// openshell.v1.OpenShell, wire-facts §1). Dial streams to target
// protocol.TargetOpenShell reach Addr; inventories list its sandboxes.
type OpenShellTarget struct {
	// Addr is the gateway's gRPC address, host:port (e.g. 127.0.0.1:8080).
	// Required.
	Addr string
	// Token, if set, is sent as "authorization: Bearer <token>" on the
	// agent's own calls (inventory listings, sandbox-stream deletes), and
	// only there: dial streams carry the callers' bytes, whose
	// authorization passes through untouched. It is never logged.
	Token string
	// Workspaces are the workspaces an inventory lists. Empty means
	// ["default"].
	Workspaces []string
	// TLS, if set, is the client TLS configuration of the agent's own calls
	// (dial streams are raw bytes: TLS, if any, is the caller's).
	// Nil means plaintext, as a gateway bound to loopback usually serves.
	TLS *tls.Config
}

// OpenSandboxTarget is the node's OpenSandbox lifecycle server (REST under
// /v1, wire-facts §2). Dial streams to target protocol.TargetOpenSandbox
// reach Addr; inventories list its sandboxes.
type OpenSandboxTarget struct {
	// Addr is the lifecycle server's HTTP address, host:port (e.g.
	// 127.0.0.1:8090). Required.
	Addr string
	// APIKey, if set, is sent as OPEN-SANDBOX-API-KEY on the agent's own
	// calls (inventory listings, sandbox-stream deletes), never added to
	// dial streams. It is never logged.
	APIKey string
}

// validateTargets reports every problem with c's targets (OpenShell,
// OpenSandbox, Targets, MaxDials and the dial and inventory timeouts).
func (c *Config) validateTargets() []error {
	var errs []error
	if o := c.OpenShell; o != nil {
		if err := CheckTargetAddr(o.Addr); err != nil {
			errs = append(errs, fmt.Errorf("agent config: OpenShell.Addr: %w", err))
		}
		if err := checkSecret(o.Token); err != nil {
			errs = append(errs, fmt.Errorf("agent config: OpenShell.Token: %w", err))
		}
		seen := map[string]bool{}
		for _, w := range o.Workspaces {
			switch {
			case strings.TrimSpace(w) != w || w == "":
				errs = append(errs, fmt.Errorf("agent config: OpenShell.Workspaces: %q is empty or has surrounding spaces", w))
			case seen[w]:
				errs = append(errs, fmt.Errorf("agent config: OpenShell.Workspaces: %q is listed twice", w))
			}
			seen[w] = true
		}
	}
	if o := c.OpenSandbox; o != nil {
		if err := CheckTargetAddr(o.Addr); err != nil {
			errs = append(errs, fmt.Errorf("agent config: OpenSandbox.Addr: %w", err))
		}
		if err := checkSecret(o.APIKey); err != nil {
			errs = append(errs, fmt.Errorf("agent config: OpenSandbox.APIKey: %w", err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Targets)) {
		if name == protocol.TargetOpenShell || name == protocol.TargetOpenSandbox {
			field := "OpenShell"
			if name == protocol.TargetOpenSandbox {
				field = "OpenSandbox"
			}
			errs = append(errs, fmt.Errorf("agent config: Targets: %q is reserved for the %s gateway (configure it with %s)", name, name, field))
			continue
		}
		if name == protocol.TargetOwnPorts {
			errs = append(errs, fmt.Errorf("agent config: Targets: %q is reserved (the SSH login's own loopback ports)", name))
			continue
		}
		if err := protocol.ValidTargetName(name); err != nil {
			errs = append(errs, fmt.Errorf("agent config: Targets: %w", err))
		}
		if err := CheckTargetAddr(c.Targets[name]); err != nil {
			errs = append(errs, fmt.Errorf("agent config: Targets: target %q: %w", name, err))
		}
	}
	if c.MaxDials < 0 {
		errs = append(errs, fmt.Errorf("agent config: MaxDials %d is negative", c.MaxDials))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("agent config: DialTimeout %v is negative", c.DialTimeout))
	}
	if c.InventoryTimeout < 0 {
		errs = append(errs, fmt.Errorf("agent config: InventoryTimeout %v is negative", c.InventoryTimeout))
	}
	return errs
}

// checkTargetAddr checks a target address: host:port with a non-empty
// host and a port number from 1 to 65535.
func CheckTargetAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", addr, port)
	}
	return nil
}

// checkSecret checks a token or key that goes into a request header: it
// may be empty (none), but may not hold spaces or control characters.
func checkSecret(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			// The secret itself is never echoed.
			return errors.New("has spaces or control characters (trim the file it came from)")
		}
	}
	return nil
}

// targetTable returns the addresses of c's targets by name: the two
// gateways (when configured) and the operator's Targets.
func (c *Config) targetTable() map[string]string {
	t := make(map[string]string, len(c.Targets)+2)
	maps.Copy(t, c.Targets)
	if c.OpenShell != nil {
		t[protocol.TargetOpenShell] = c.OpenShell.Addr
	}
	if c.OpenSandbox != nil {
		t[protocol.TargetOpenSandbox] = c.OpenSandbox.Addr
	}
	return t
}
