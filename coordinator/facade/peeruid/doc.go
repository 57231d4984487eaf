// Package peeruid learns which local user a loopback TCP caller is: the
// uid that owns the caller's socket, as the kernel reports it. The
// facades use it to name callers that bring no credentials (a facade on
// loopback without tokens): the socket's owner is the one fact about such
// a caller that it cannot forge.
//
// On Linux, Lookup asks the kernel's socket diagnostics (sock_diag(7),
// netlink, one exact lookup of the caller's end of the connection: local
// address the caller's, remote ours) for the socket's uid: the effective
// (file system) uid of the process that created it. A socket handed to
// another process keeps its creator's uid. Where sock_diag is not
// available it reads /proc/net/tcp and /proc/net/tcp6 of the process's
// network namespace instead (the caller is on loopback, so in the same
// one), whose cost grows with the host's sockets. Either way callers look
// up once per connection (Peer, ConnContext), not per request.
//
// Elsewhere, and for a caller that is not on loopback, Lookup fails: the
// facades then leave the caller unidentified (refused), never guess.
//
// Identity names a uid for policy: token:loopback-uid-N.
package peeruid
