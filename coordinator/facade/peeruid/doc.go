// Package peeruid learns which local user a loopback TCP caller is: the
// uid that owns the caller's socket, as the kernel reports it. The
// facades use it to name callers that bring no credentials (a facade on
// loopback without tokens): the socket's owner is the one fact about such
// a caller that it cannot forge.
//
// On Linux, Lookup reads /proc/net/tcp and /proc/net/tcp6 of the
// process's network namespace (the caller is on loopback, so in the same
// one) and finds the caller's end of the connection: the row whose local
// address is the caller's address and whose remote address is ours. Its
// uid column is the socket's owner: the effective (file system) uid of
// the process that created it. A socket handed to another process keeps
// its creator's uid. The cost grows with the host's TCP sockets, so
// callers look up once per connection (Context, Conn) rather than per
// request.
//
// Elsewhere, and for a caller that is not on loopback, Lookup fails: the
// facades then leave the caller unidentified (refused), never guess.
//
// Identity names a uid for policy: token:loopback-uid-N.
package peeruid
