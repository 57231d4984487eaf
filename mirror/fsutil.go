package mirror

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Every lookup inside a tree being copied starts from a directory
// descriptor this copy holds and never follows a symlink: openat2 with
// beneath, or, where the kernel lacks openat2 (before Linux 5.6, or a
// seccomp filter refuses it), one openat(O_NOFOLLOW) per component.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

var (
	openat2Once sync.Once
	openat2OK   bool
	// noOpenat2 makes tests take the fallback.
	noOpenat2 bool
)

// haveOpenat2 reports whether openat2 works here (probed once).
func haveOpenat2() bool {
	if noOpenat2 {
		return false
	}
	openat2Once.Do(func() {
		fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: beneath})
		if err == nil {
			unix.Close(fd)
			openat2OK = true
		}
	})
	return openat2OK
}

// openBeneath opens rel (".", or a clean relative slash-separated path
// without "..") below the directory dfd, following no symlink on the way
// or at the end, with flags (O_NOFOLLOW and O_CLOEXEC are added) and mode.
func openBeneath(dfd int, rel string, flags int, mode uint32) (int, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if rel == "" || strings.HasPrefix(rel, "/") {
		return -1, unix.EINVAL
	}
	if haveOpenat2() {
		for range 64 {
			fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: beneath})
			// EAGAIN: a rename or mount raced with the lookup; retry.
			if err == unix.EINTR || err == unix.EAGAIN {
				continue
			}
			if err != unix.ENAMETOOLONG {
				return fd, err
			}
			break // a path past PATH_MAX: walk it a component at a time
		}
	}
	return openWalk(dfd, rel, flags, mode)
}

// openWalk is openBeneath one component at a time.
func openWalk(dfd int, rel string, flags int, mode uint32) (int, error) {
	cur := dfd
	defer func() {
		if cur != dfd {
			unix.Close(cur)
		}
	}()
	for {
		name, rest, more := strings.Cut(rel, "/")
		if name == ".." || name == "" {
			return -1, unix.EXDEV
		}
		if !more {
			return openAt1(cur, name, flags, mode)
		}
		next, err := openAt1(cur, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if cur != dfd {
			unix.Close(cur)
		}
		cur, rel = next, rest
	}
}

// openAt1 is openat of one component, retried on EINTR.
func openAt1(dfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dfd, name, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// fileID is a file's identity: what a descriptor or a directory entry
// refers to, whatever its name.
type fileID struct{ dev, ino uint64 }

func idOf(st *unix.Stat_t) fileID { return fileID{uint64(st.Dev), st.Ino} }

// fdID returns the identity of the open file fd.
func fdID(fd int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, err
	}
	return idOf(&st), nil
}

// walkUp calls fn with the identity of the directory fd and of every
// directory above it, up to the root of the file system tree, until fn
// returns true. It follows ".." on descriptors, never names.
func walkUp(fd int, fn func(fileID) bool) error {
	cur, err := openAt1(fd, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer func() { unix.Close(cur) }()
	id, err := fdID(cur)
	if err != nil {
		return err
	}
	for range 4096 {
		if fn(id) {
			return nil
		}
		up, err := openAt1(cur, "..", unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		unix.Close(cur)
		cur = up
		upID, err := fdID(cur)
		if err != nil {
			return err
		}
		if upID == id {
			return nil // "/" is its own parent
		}
		id = upID
	}
	return errors.New("directory tree deeper than 4096 levels")
}

// readlinkAt reads the target of the symlink name in dfd ("" with an
// O_PATH descriptor of the link itself).
func readlinkAt(dfd int, name string) (string, error) {
	for n := 256; n <= 64<<10; n *= 4 {
		buf := make([]byte, n)
		m, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
	return "", unix.ENAMETOOLONG
}

// isMountRoot reports whether the directory fd is the root of a mount
// (statx STATX_ATTR_MOUNT_ROOT, else a device differing from its
// parent's).
func isMountRoot(fd int) bool {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO, &stx); err == nil &&
		stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	var st, up unix.Stat_t
	if unix.Fstat(fd, &st) != nil || unix.Fstatat(fd, "..", &up, 0) != nil {
		return false
	}
	return st.Dev != up.Dev
}

// errMountPoint is returned when a removal reaches a mount point.
var errMountPoint = errors.New("is a mount point: not removed")

// removeAt removes name in the directory dfd: a file, a symlink (never
// followed) or a whole tree. It does not cross into mounted file systems:
// a mount point found on the way fails the removal with errMountPoint
// (what was removed before stays removed). A directory whose permissions
// stop the removal is made writable first. A missing name is not an
// error. Errors are *fs.PathError with the path below dfd.
func removeAt(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return &fs.PathError{Op: "unlink", Path: name, Err: err}
	}
	fd, err := openAt1(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	if isMountRoot(fd) {
		return &fs.PathError{Op: "remove", Path: name, Err: errMountPoint}
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		unix.Fchmod(fd, 0o700)
		if names, err = d.Readdirnames(-1); err != nil {
			return &fs.PathError{Op: "readdir", Path: name, Err: err}
		}
	}
	chmodded := false
	for _, n := range names {
		err := removeAt(fd, n)
		if err != nil && !chmodded && !errors.Is(err, errMountPoint) {
			chmodded = true
			unix.Fchmod(fd, 0o700)
			err = removeAt(fd, n)
		}
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				pe.Path = name + "/" + pe.Path
			}
			return err
		}
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}
