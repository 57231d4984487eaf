// Package identity is the syntax of a caller's identity, KIND:VALUE, as a
// policy's identities entries, job owners and audit events write it (nats:,
// nats-account:, cert:, token:, ssh-key:, ssh-principal:), and of the names
// inside it.
//
// It is a leaf (protocol and nkeys only) so that the client build can check
// an identity it is given (tether job list --owner, tether audit --identity)
// by the policy's own rule without linking the policy parser, YAML or
// Prometheus; package policy maps these kinds to its Kind.
package identity
