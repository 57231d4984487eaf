// Package sockdiag asks the Linux kernel's socket diagnostics
// (sock_diag(7), netlink NETLINK_SOCK_DIAG) who owns a TCP socket: the
// uid the kernel recorded when the socket was made (the file system uid
// of the creating thread; a socket accepted from a listener takes the
// listener's). Two questions are answered:
//
//   - Owner: the socket of one exact connection (local and remote
//     address and port), IPv4 and IPv6 (an IPv4 connection is also
//     looked up as IPv4-mapped IPv6, for a dual-stack socket);
//   - Listeners: every TCP socket in the LISTEN state on a port, both
//     families, with its bound address (wildcards included).
//
// Each query opens one netlink socket, sends one request and waits at
// most a second for the answer. Where the netlink family is missing (not
// Linux, a kernel or sandbox without it) the functions fail with an error
// matching ErrUnavailable, so callers can fall back or refuse; they never
// guess an owner. Safe for concurrent use; no goroutines.
package sockdiag
