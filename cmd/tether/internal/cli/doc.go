// Package cli implements the tether command line: the daemons (`tether
// coordinator`, `tether agent`, `tether dev`) and the client commands
// (`tether exec`, `tether nodes`, `tether version`). It owns flags, their
// validation, wiring of the coordinator, agent and client packages, and the
// mapping of outcomes to exit codes; the behaviour itself lives in those
// packages.
//
// Run is the whole program: main only builds a signal context and exits with
// Run's code. Run is testable in-process: it takes its arguments, standard
// streams and context as parameters, and there are no package-level flag
// variables (each command's options are a documented struct with defaults and
// a Validate method). Flags are the only configuration source for now; the
// environment is read only for the secrets TETHER_TOKEN,
// TETHER_OPENSHELL_TOKEN and TETHER_OPENSANDBOX_API_KEY (unset once read),
// TETHER_NATS_URL, and TETHER_RUN/NEMO_GYM_RUN_ID (run-lease's run id), all
// through env.getenv, and for XDG_STATE_HOME/HOME when computing the default
// data directories.
//
// # Exit codes
//
//	0    success
//	1    failure (an error, or for `exec` on several nodes: any node failed)
//	2    usage error (bad flags or arguments); nothing was done
//	124  `exec` on one node: the job timed out
//	130  `exec`: interrupted (the remote job was cancelled)
//	N    `exec` on one node: the remote exit code (128+signal when killed)
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
