// Package cli implements the tether command line: the daemons (`tether
// coordinator`, `tether agent`, `tether dev`) and the client commands
// (`tether exec`, `tether nodes`, `tether version`). It owns flags, their
// validation, wiring of the coordinator, agent and client packages, and the
// mapping of outcomes to exit codes; the behaviour itself lives in those
// packages.
//
// The client-only build (-tags tetherclient, build_client.go) compiles the
// same command tree without the files marked //go:build !tetherclient:
// the daemons, config, policy and nats commands are then hidden stand-ins
// that refuse with exit code 2, and none of their packages is linked.
//
// Run is the whole program: main only builds a signal context and exits with
// Run's code. Run is testable in-process: it takes its arguments, standard
// streams and context as parameters, and there are no package-level flag
// variables (each command's options are a documented struct with defaults and
// a Validate method). The daemons `agent` and `coordinator` also read a
// strict YAML config file (--config, TETHER_CONFIG; config.go) whose keys
// are their flag names: flag > env > file > default, and SIGHUP re-reads
// it (configreload.go). The environment is read only for the secrets
// TETHER_TOKEN,
// TETHER_OPENSHELL_TOKEN and TETHER_OPENSANDBOX_API_KEY (unset once read),
// TETHER_NATS_URL, TETHER_NATS_CREDS (a credentials file's path), and
// TETHER_RUN/NEMO_GYM_RUN_ID (run-lease's run id), TETHER_CONFIG and the
// variables a config file names for secrets, all through env.getenv,
// for XDG_STATE_HOME/HOME when computing the default data directories, and
// for XDG_CONFIG_HOME/HOME (through env.getenv) to find the nats CLI's
// context and the dev credentials (~/.config/tether/dev.creds).
//
// # Exit codes
//
// Who failed is in the code: the remote (or, for run-lease, local) command,
// or Tether itself (ssh's convention).
//
//	0    success
//	N    `exec --node`, `shell`, `job logs --follow`, `run-lease`: the
//	     command's own exit code (128+N when signal N killed it)
//	1    `exec` on several nodes: some node failed; `cp`: the copy failed
//	     (a path missing, not permitted, not under a copy root); daemons:
//	     failure
//	2    usage error (bad flags or arguments); nothing was done
//	23   `cp`: partial copy (rsync's code; see cp.go)
//	124  the timeout killed the command
//	126  the command exists on the node but cannot be executed
//	127  the command was not found (on the node; locally for run-lease)
//	130  interrupted (SIGINT; the remote job was cancelled); 143 on SIGTERM
//	254  `exec`, `job logs --follow`: the command (every node) succeeded,
//	     but its output is incomplete: output past the output limit was
//	     dropped, or (`exec`) the agent's --pipe-wait cut it (output_cut)
//	255  a client command (`cp` too) failed in Tether: no coordinator,
//	     node not connected or no node matched, tunnel lost, coordinator
//	     shut down, bad cwd, internal error (clientCommand, failureCode,
//	     cpOutcome)
//
// # Exec output
//
// Output is written as it streams: stdout to stdout, stderr to stderr. When a
// job targets several nodes (--selector, --all) each line is prefixed with
// "node-id | "; output is line-buffered per node and stream so prefixes land
// at line starts, and partial last lines are completed with a newline when
// the job ends. With --json, stdout carries one JSON object per output chunk,
// {"node":..., "stream":"stdout"|"stderr", "data":"..."} (data is the chunk
// as a string; invalid UTF-8 is replaced), then the protocol.ExecResult as
// the last line; the exit code is computed as without --json.
//
// # Human output
//
// Tables and "key: value" lines show every field other users, agents or
// gateways wrote (commands, copy paths, identities, node ids and labels,
// sandbox names, errors) through printable (termsafe.go; writeRow for a
// table row): controls, bidi and other unprintable characters and bytes
// that are not UTF-8 are escaped in Go's notation, so that they cannot
// act on the terminal of whoever reads them. --json is exact.
//
// # Goroutines
//
// The daemon commands run the coordinator, agent, embedded NATS server and
// admin HTTP server on goroutines they start and wait for before returning;
// every one stops when Run's ctx is done. Client commands start none.
//
// # Imports
//
// cli is the only package that imports coordinator, agent and client
// together. It holds wiring only: no protocol logic, no job logic.
package cli
