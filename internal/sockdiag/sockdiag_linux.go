package sockdiag

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// The structures, from linux/inet_diag.h:
//
//	struct inet_diag_sockid { __be16 sport, dport; __be32 src[4], dst[4]; __u32 if; __u32 cookie[2]; }  // 48 bytes
//	struct inet_diag_req_v2 { __u8 family, protocol, ext, pad; __u32 states; struct inet_diag_sockid id; } // 56 bytes
//	struct inet_diag_msg    { __u8 family, state, timer, retrans; struct inet_diag_sockid id;
//	                          __u32 expires, rqueue, wqueue, uid, inode; }                               // 72 bytes, uid at 64
const (
	sizeofNlMsghdr   = 16
	sizeofDiagReqV2  = 56
	sizeofDiagMsg    = 72
	diagMsgUIDOffset = 64
)

// Owner returns the TCP socket whose local end is local and whose remote
// end is remote, with its owner and state; found is false when there is
// none (the connection is gone, or never was). An IPv4 pair is looked up
// in the IPv4 table, then as IPv4-mapped IPv6. Errors match
// ErrUnavailable.
func Owner(local, remote netip.AddrPort) (s Socket, found bool, err error) {
	local = unmap(local)
	remote = unmap(remote)
	fd, err := open()
	if err != nil {
		return Socket{}, false, fmt.Errorf("owner of the socket %s→%s: %w", local, remote, err)
	}
	defer unix.Close(fd)
	families := []uint8{unix.AF_INET6}
	if local.Addr().Is4() {
		families = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	for _, fam := range families {
		req := request(fam, unix.NLM_F_REQUEST, 0xffffffff, local, remote)
		var socks []Socket
		socks, err = exchange(fd, req, false)
		if err != nil {
			return Socket{}, false, fmt.Errorf("owner of the socket %s→%s: %w", local, remote, err)
		}
		// The kernel's exact lookup falls back to a listener of the
		// local address: only the very connection counts.
		for _, s := range socks {
			if s.Local == local && s.Remote == remote && s.State != StateListen {
				return s, true, nil
			}
		}
	}
	return Socket{}, false, nil
}

// Listeners returns every TCP socket in the LISTEN state on port, IPv4
// and IPv6, in the kernel's order (none: nobody listens). Errors match
// ErrUnavailable.
func Listeners(port uint16) ([]Socket, error) {
	fd, err := open()
	if err != nil {
		return nil, fmt.Errorf("listeners on port %d: %w", port, err)
	}
	defer unix.Close(fd)
	var out []Socket
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		var zero netip.AddrPort
		if fam == unix.AF_INET {
			zero = netip.AddrPortFrom(netip.IPv4Unspecified(), port)
		} else {
			zero = netip.AddrPortFrom(netip.IPv6Unspecified(), port)
		}
		req := request(fam, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, 1<<StateListen, zero, netip.AddrPort{})
		socks, err := exchange(fd, req, true)
		if err != nil {
			return nil, fmt.Errorf("listeners on port %d: %w", port, err)
		}
		for _, s := range socks {
			// The dump filters by port on most kernels; not trusted.
			if s.State == StateListen && s.Local.Port() == port {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// open opens a netlink sock_diag socket that waits at most a second for
// an answer: a kernel that does not answer must not hang the caller.
func open() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return -1, fmt.Errorf("%w: %v", ErrUnavailable, os.NewSyscallError("socket(AF_NETLINK, NETLINK_SOCK_DIAG)", err))
	}
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: %v", ErrUnavailable, os.NewSyscallError("setsockopt(SO_RCVTIMEO)", err))
	}
	return fd, nil
}

// request is one SOCK_DIAG_BY_FAMILY request for TCP sockets of family in
// states (a bit mask, 1<<state) with the given local (src) and remote
// (dst) ends.
func request(family uint8, flags uint16, states uint32, src, dst netip.AddrPort) []byte {
	req := make([]byte, sizeofNlMsghdr+sizeofDiagReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], flags)
	ne.PutUint32(req[8:], 1) // seq
	r := req[sizeofNlMsghdr:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], states)
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	putAddr(id[4:20], family, src.Addr())
	putAddr(id[20:36], family, dst.Addr())
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], 0xffffffff)
	return req
}

// putAddr writes a as inet_diag_sockid's src or dst of family: four bytes
// for AF_INET, sixteen (IPv4-mapped for an IPv4 address) for AF_INET6. An
// invalid (zero) address writes nothing: the wildcard.
func putAddr(b []byte, family uint8, a netip.Addr) {
	if !a.IsValid() {
		return
	}
	if family == unix.AF_INET {
		v4 := a.Unmap().As4()
		copy(b, v4[:])
		return
	}
	v6 := a.As16()
	copy(b, v6[:])
}

// exchange sends req and collects the sockets of the answer: one message
// (or an ENOENT error: none) for an exact lookup, messages up to
// NLMSG_DONE for a dump.
func exchange(fd int, req []byte, dump bool) ([]Socket, error) {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("%w: send: %v", ErrUnavailable, err)
	}
	ne := binary.NativeEndian
	buf := make([]byte, 64<<10)
	var out []Socket
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: receive: %v", ErrUnavailable, err)
		}
		b := buf[:n]
		for len(b) > 0 {
			if len(b) < sizeofNlMsghdr {
				return nil, fmt.Errorf("%w: short message (%d bytes)", ErrUnavailable, len(b))
			}
			l := int(ne.Uint32(b[0:]))
			if l < sizeofNlMsghdr || l > len(b) {
				return nil, fmt.Errorf("%w: message length %d of %d bytes", ErrUnavailable, l, len(b))
			}
			msg := b[:l]
			if next := (l + 3) &^ 3; next < len(b) {
				b = b[next:]
			} else {
				b = nil
			}
			switch typ := ne.Uint16(msg[4:]); typ {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(msg) < sizeofNlMsghdr+4 {
					return nil, fmt.Errorf("%w: short error message", ErrUnavailable)
				}
				errno := unix.Errno(-int32(ne.Uint32(msg[sizeofNlMsghdr:])))
				if errno == 0 { // an acknowledgement
					continue
				}
				if errno == unix.ENOENT && !dump {
					return nil, nil
				}
				return nil, fmt.Errorf("%w: %v", ErrUnavailable, os.NewSyscallError("sock_diag", errno))
			case unix.SOCK_DIAG_BY_FAMILY:
				s, err := parse(msg[sizeofNlMsghdr:])
				if err != nil {
					return nil, err
				}
				out = append(out, s)
				if !dump {
					return out, nil
				}
			default:
				return nil, fmt.Errorf("%w: message of type %d", ErrUnavailable, typ)
			}
		}
	}
}

// parse decodes one inet_diag_msg.
func parse(m []byte) (Socket, error) {
	if len(m) < sizeofDiagMsg {
		return Socket{}, fmt.Errorf("%w: short inet_diag_msg (%d bytes)", ErrUnavailable, len(m))
	}
	fam := m[0]
	addr := func(b []byte) netip.Addr {
		if fam == unix.AF_INET {
			return netip.AddrFrom4([4]byte(b[:4]))
		}
		return netip.AddrFrom16([16]byte(b[:16])).Unmap()
	}
	id := m[4:]
	return Socket{
		Local:  netip.AddrPortFrom(addr(id[4:20]), binary.BigEndian.Uint16(id[0:])),
		Remote: netip.AddrPortFrom(addr(id[20:36]), binary.BigEndian.Uint16(id[2:])),
		IPv6:   fam == unix.AF_INET6,
		State:  m[1],
		UID:    binary.NativeEndian.Uint32(m[diagMsgUIDOffset:]),
	}, nil
}
