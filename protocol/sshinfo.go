package protocol

// SubjectSSHInfo takes an SSHInfoRequest (an empty body is allowed) and
// replies with an SSHInfo: what an OpenSSH client needs to reach the
// caller's nodes (tether ssh-config writes its config and known_hosts
// from it). The nodes listed are the connected ones that serve SSH on
// which the caller's policy grants both nodes.list and ssh; a caller no
// policy entry names is refused (403), as for SubjectNodes.
const SubjectSSHInfo = "tether.v1.ssh.info"

// SSHInfoRequest is the body of a SubjectSSHInfo request. It has no
// fields yet; unknown ones are refused.
type SSHInfoRequest struct{}

// Validate accepts every SSHInfoRequest.
func (r *SSHInfoRequest) Validate() *APIError { return nil }

// MaxSSHInfoNodes bounds SSHInfo.Nodes; SSHInfo.NodesTotal counts them
// all.
const MaxSSHInfoNodes = 1000

// SSHInfo is the reply to SubjectSSHInfo.
type SSHInfo struct {
	// Coordinator is the id of the coordinator that answered.
	Coordinator string `json:"coordinator"`
	// JumpAddr is the address the coordinator's SSH jump host listens on
	// as configured (--ssh-addr, "HOST:PORT"; HOST may be empty or
	// unspecified, "0.0.0.0", when it listens on every interface: a
	// client then uses the host it reached NATS at). Empty when the
	// coordinator runs no jump host: clients use tether ssh-proxy.
	JumpAddr string `json:"jump_addr,omitempty"`
	// JumpHostKey is the jump host's public host key in authorized_keys
	// form ("ssh-ed25519 AAAA…"); empty without a jump host.
	JumpHostKey string `json:"jump_host_key,omitempty"`
	// KnownHostsCA is the known_hosts line that trusts every node's host
	// certificate ("@cert-authority *.tether ssh-ed25519 AAAA…"); empty
	// when the coordinator has no SSH host CA.
	KnownHostsCA string `json:"known_hosts_ca,omitempty"`
	// Nodes are the nodes the caller may log in to, sorted by id, at most
	// MaxSSHInfoNodes.
	Nodes []SSHInfoNode `json:"nodes"`
	// NodesTotal is how many nodes there were (more than len(Nodes) when
	// some were left out).
	NodesTotal int `json:"nodes_total"`
}

// SSHInfoNode is one node of SSHInfo.
type SSHInfoNode struct {
	// ID is the node id.
	ID string `json:"id"`
	// Alias is the host name OpenSSH reaches it by: ID + SSHHostSuffix.
	Alias string `json:"alias"`
	// Logins are the local accounts the caller may log in as there (the
	// run_as of every ssh grant), sorted.
	Logins []string `json:"logins"`
}
