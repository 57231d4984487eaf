// Package e2e holds Tether's multi-process end-to-end tests. They build the
// tether binary (with -race) and run it as a coordinator and as agents on
// loopback, then drive the fleet through NATS with a plain nats.go client and
// through the CLI, as a user would.
//
// The SSH tests (ssh_test.go) drive the real OpenSSH client, rsync, sftp,
// scp and a Python client shaped like NeMo Gym's SSHConnection
// (python/test_ngssh.py) through the coordinator's jump host and tether
// ssh-proxy, with the config tether ssh-config prints and no sshd
// anywhere. The SSH benchmark (sshbench_test.go, build tags e2e and
// sshbench, `make bench-ssh`) compares that path with a throwaway sshd on
// loopback.
//
// The cluster test (cluster_test.go, TestCluster) runs issue 11's fleet:
// 3 nats-server processes clustered with JetStream (built from the
// module's own nats-server dependency), 3 coordinators with --nats-url and
// 20 agents given all 3 coordinator addresses; then, in turn, kill -9 of a
// coordinator with 200 jobs in flight, one NATS server stopped, one
// coordinator partitioned from NATS (a TCP proxy of the test's that stops
// forwarding without closing), a rolling restart under load and a restart
// of everything. It logs its measurements on lines starting MEASURE.
//
// The tests carry the build tag e2e: run them with `make test-e2e` or
// `go test -tags e2e ./e2e/`. Pass -tether-bin=PATH to test a prebuilt binary.
package e2e
