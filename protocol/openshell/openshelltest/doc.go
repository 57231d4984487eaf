// Package openshelltest is a fake OpenShell gateway for tests: a real
// grpc-go server for service openshell.v1.OpenShell, written from
// reference/wire-facts.md §1 so that clients, the agent's dial target and
// the coordinator's facade see what a real gateway would say on the wire —
// the same method paths, messages, status codes and, where the facts give
// them, the same error texts (vectors OS-1..OS-17, OS-20).
//
// It keeps sandboxes in memory, per workspace ("default" always exists;
// others with AddWorkspace). Phases move PROVISIONING → READY after
// Options.ReadyAfter and DELETING → gone after Options.DeleteLinger; both are
// evaluated from the wall clock whenever the gateway is called, so a test
// that sets them to 0 sees the next state on its very next call, and one
// that sets them negative drives the phases itself (SetPhase, Drop). Exec
// runs the command on the host through Options.Exec (DefaultExec: os/exec in
// a private directory per sandbox). Tests can count calls (Calls, Creates),
// inject failures (Inject), make a sandbox's compute vanish
// (VanishCompute), require a bearer token (Options.Token) and cut every
// connection as a restart would (Restart).
//
// There are no generated gRPC stubs: the service is a hand-written
// grpc.ServiceDesc whose handlers decode the generated messages of
// protocol/openshell; methods it does not declare answer UNIMPLEMENTED, as
// methods of a newer gateway would to an older client.
//
// Goroutines: one accept loop per Serve, the grpc server's own, one per
// running exec's output and, for ExecSandboxInteractive, one input reader.
// Close stops them all and waits for them. One mutex (Gateway.mu) guards
// all state; it is never held while sending on a stream or running a
// command. As a test double it may open sockets and start processes (the
// purity rule of protocol/ exempts packages named *test); it must not be
// imported by non-test code.
package openshelltest
