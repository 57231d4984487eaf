package peeruid

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// The kernel's socket diagnostics (sock_diag(7)) answer "who owns this
// TCP socket" for one exact 4-tuple in microseconds, where /proc/net/tcp
// walks every socket (milliseconds on a busy host). The structures, from
// linux/inet_diag.h:
//
//	struct inet_diag_sockid { __be16 sport, dport; __be32 src[4], dst[4]; __u32 if; __u32 cookie[2]; }  // 48 bytes
//	struct inet_diag_req_v2 { __u8 family, protocol, ext, pad; __u32 states; struct inet_diag_sockid id; } // 56 bytes
//	struct inet_diag_msg    { __u8 family, state, timer, retrans; struct inet_diag_sockid id;
//	                          __u32 expires, rqueue, wqueue, uid, inode; }                               // uid at 64
const (
	sizeofNlMsghdr   = 16
	sizeofDiagReqV2  = 56
	diagMsgUIDOffset = 64
)

// errNoDiag reports that sock_diag cannot answer here (no such netlink
// family in this kernel or sandbox): Lookup falls back to /proc.
var errNoDiag = errors.New("sock_diag unavailable")

// diagLookup asks sock_diag for the owner of the socket whose local end is
// src (the caller's) and remote end dst (ours): with the IPv4 family for
// IPv4 addresses, then as IPv4-mapped IPv6 (a dual-stack caller socket).
// found is false when no such socket exists.
func diagLookup(src, dst netip.AddrPort) (uid uint32, found bool, err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %v", errNoDiag, err)
	}
	defer unix.Close(fd)
	// A kernel that does not answer must not hang a facade call.
	tv := unix.Timeval{Sec: 1}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	families := []uint8{unix.AF_INET6}
	if src.Addr().Is4() {
		families = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	for _, fam := range families {
		uid, found, err = diagOne(fd, fam, src, dst)
		if err != nil || found {
			return uid, found, err
		}
	}
	return 0, false, nil
}

func diagOne(fd int, family uint8, src, dst netip.AddrPort) (uint32, bool, error) {
	var req [sizeofNlMsghdr + sizeofDiagReqV2]byte
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // seq
	r := req[sizeofNlMsghdr:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	putAddr(id[4:20], family, src.Addr())
	putAddr(id[20:36], family, dst.Addr())
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, false, fmt.Errorf("%w: send: %v", errNoDiag, err)
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, false, fmt.Errorf("%w: receive: %v", errNoDiag, err)
	}
	buf = buf[:n]
	if len(buf) < sizeofNlMsghdr {
		return 0, false, fmt.Errorf("%w: short answer (%d bytes)", errNoDiag, n)
	}
	switch ne.Uint16(buf[4:]) {
	case unix.NLMSG_ERROR:
		if len(buf) < sizeofNlMsghdr+4 {
			return 0, false, fmt.Errorf("%w: short error", errNoDiag)
		}
		errno := -int32(ne.Uint32(buf[sizeofNlMsghdr:]))
		if unix.Errno(errno) == unix.ENOENT {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("%w: %v", errNoDiag, os.NewSyscallError("sock_diag", unix.Errno(errno)))
	case unix.SOCK_DIAG_BY_FAMILY:
		if len(buf) < sizeofNlMsghdr+diagMsgUIDOffset+4 {
			return 0, false, fmt.Errorf("%w: short answer (%d bytes)", errNoDiag, n)
		}
		return ne.Uint32(buf[sizeofNlMsghdr+diagMsgUIDOffset:]), true, nil
	}
	return 0, false, fmt.Errorf("%w: answer of type %d", errNoDiag, ne.Uint16(buf[4:]))
}

// putAddr writes a as inet_diag_sockid's src or dst of family: four bytes
// for AF_INET, sixteen (IPv4-mapped for an IPv4 address) for AF_INET6.
func putAddr(b []byte, family uint8, a netip.Addr) {
	if family == unix.AF_INET {
		v4 := a.As4()
		copy(b, v4[:])
		return
	}
	v6 := a.As16()
	copy(b, v6[:])
}
