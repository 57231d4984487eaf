// Package repocheck holds tests that enforce repository-wide rules which no
// single package can check about itself:
//
//   - every Go package directory has exactly one package doc comment
//     (STYLE.md habit 2), found by walking the module root;
//   - the dependency direction of DESIGN.md section 2 (STYLE.md habit 3),
//     checked on the non-test dependency graph from `go list`: agent never
//     imports coordinator, nats.go or nats-server; protocol imports only the
//     standard library (and, later, the protobuf runtime); tunnel knows
//     nothing of agent, coordinator, client or NATS; coordinator does not
//     import agent; client does not import agent, coordinator or tunnel;
//   - the systemd units in systemd/ pass `systemd-analyze verify` (when it
//     is installed) and keep what the daemons' sd_notify support needs.
//
// The package has no non-test code besides this comment; it starts no
// goroutines and must be imported by nothing.
package repocheck
