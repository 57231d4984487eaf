package peeruid

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
)

// procFiles are the kernel's TCP socket tables; a caller on an IPv4
// address may hold an IPv6 socket (IPv4-mapped), so both are searched.
var procFiles = []string{"/proc/net/tcp", "/proc/net/tcp6"}

func lookup(local, remote netip.AddrPort) (uint32, error) {
	uid, found, err := diagLookup(remote, local)
	switch {
	case found:
		return uid, nil
	case err == nil:
		return 0, errors.New("no socket of the caller (sock_diag; it hung up?)")
	}
	return procLookup(local, remote) // sock_diag is not there: the slow way
}

// procLookup is lookup through /proc/net/tcp and /proc/net/tcp6.
func procLookup(local, remote netip.AddrPort) (uint32, error) {
	var errs []error
	for _, f := range procFiles {
		uid, found, err := scan(f, local, remote)
		if found {
			return uid, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return 0, errors.Join(errs...)
	}
	return 0, errors.New("no socket of the caller in /proc/net/tcp or /proc/net/tcp6 (it hung up?)")
}

// scan finds, in one table, the row whose local address is remote (the
// caller's end) and whose remote address is local (ours). Rows read:
//
//	sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
//	0: 0100007F:1F92 0100007F:D431 01 ...
func scan(path string, local, remote netip.AddrPort) (uid uint32, found bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, false, nil // no IPv6 in this kernel
		}
		return 0, false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 512), 64<<10)
	sc.Scan() // the header
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 8 {
			continue
		}
		if a, ok := parseAddr(f[1]); !ok || a != remote {
			continue
		}
		if a, ok := parseAddr(f[2]); !ok || a != local {
			continue
		}
		u, err := strconv.ParseUint(string(f[7]), 10, 32)
		if err != nil {
			return 0, false, fmt.Errorf("%s: uid column %q: %v", path, f[7], err)
		}
		return uint32(u), true, nil
	}
	return 0, false, sc.Err()
}

// parseAddr parses ADDR:PORT of a table row: the address as the kernel's
// 32-bit words printed %08X in the host's byte order (one word for IPv4,
// four for IPv6), the port %04X. IPv4-mapped addresses come back as IPv4.
func parseAddr(b []byte) (netip.AddrPort, bool) {
	i := bytes.IndexByte(b, ':')
	if i < 0 || (i != 8 && i != 32) {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(string(b[i+1:]), 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	var raw [16]byte
	for w := 0; w < i/8; w++ {
		v, err := strconv.ParseUint(string(b[w*8:w*8+8]), 16, 32)
		if err != nil {
			return netip.AddrPort{}, false
		}
		binary.NativeEndian.PutUint32(raw[w*4:], uint32(v))
	}
	var a netip.Addr
	if i == 8 {
		a = netip.AddrFrom4([4]byte(raw[:4]))
	} else {
		a = netip.AddrFrom16(raw).Unmap()
	}
	return netip.AddrPortFrom(a, uint16(port)), true
}
