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
// The tests carry the build tag e2e: run them with `make test-e2e` or
// `go test -tags e2e ./e2e/`. Pass -tether-bin=PATH to test a prebuilt binary.
package e2e
