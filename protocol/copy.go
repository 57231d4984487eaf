package protocol

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Copy streams (KindCopy) mirror a file or directory tree from a sender to a
// receiver, with rsync -a semantics (and --delete on request): modes, mtimes
// and symlinks are kept, symlinks are copied as links and never followed, and
// unchanged files are not sent again.
//
// Who sends depends on CopyParams.Direction: for a push the agent receives
// (the data comes from the client through the coordinator), for a pull the
// agent sends. The conversation is the same either way:
//
//  1. The receiver describes what it has at the destination: FrameManifest*
//     (JSON arrays of ManifestEntry, each frame at most MaxFrameSize) then
//     FrameManifestEnd.
//  2. The sender walks the source and sends, per entry (parents before
//     children; Tether's sender sends every directory first, then the
//     rest in lexical order, so a receiver can create files in parallel),
//     FrameEntry; for a regular file whose content must travel (Keep false)
//     it follows with FrameFileData* and FrameEntryEnd (the XXH3-128 of the
//     bytes sent). Then FrameCopyEnd.
//  3. The receiver verifies every checksum, builds the new tree in a staging
//     directory beside the destination, swaps it into place atomically, and
//     answers FrameCopyDone (or FrameError). A copy that ends any other way
//     leaves the destination as it was.
//
// Either side may send FrameError (and the client FrameCancel) at any time
// to abort. Paths are relative to the copy's root, slash separated, and
// checked with ValidCopyPath; the root itself is ".".

// Copy directions.
const (
	CopyPush = "push" // to the node: the agent receives
	CopyPull = "pull" // from the node: the agent sends
)

// CopyParams are the params of a copy stream's header.
type CopyParams struct {
	// Direction is CopyPush or CopyPull.
	Direction string `json:"direction"`
	// Path is the absolute path on the node: the destination of a push, the
	// source of a pull. The agent only accepts paths under its configured
	// copy roots.
	Path string `json:"path"`
	// Delete removes destination entries the source lacks (rsync --delete,
	// what NeMo Gym's copy does). Without it they are kept.
	Delete bool `json:"delete,omitempty"`
	// Into says the destination names a directory (the user wrote a
	// trailing slash): a file source is copied into it as DST/NAME, the
	// directory being created if needed. A file source onto an existing
	// directory lands inside it too, with or without Into.
	Into bool `json:"into,omitempty"`
	// Checksum compares files by XXH3-128 instead of size and mtime, so a
	// changed file with an unchanged size and mtime is still sent.
	Checksum bool `json:"checksum,omitempty"`
}

// Validate reports every problem with p.
func (p *CopyParams) Validate() error {
	var errs []error
	if p.Direction != CopyPush && p.Direction != CopyPull {
		errs = append(errs, fmt.Errorf("direction %q: want %q or %q", p.Direction, CopyPush, CopyPull))
	}
	if !path.IsAbs(p.Path) {
		errs = append(errs, fmt.Errorf("path %q: must be absolute", p.Path))
	}
	if strings.ContainsRune(p.Path, 0) || len(p.Path) > MaxCopyPathLen {
		errs = append(errs, fmt.Errorf("path: contains NUL or is longer than %d bytes", MaxCopyPathLen))
	}
	return errors.Join(errs...)
}

// Entry types.
const (
	EntryDir     = "dir"
	EntryFile    = "file"
	EntrySymlink = "symlink"
)

// MaxCopyPathLen bounds a path in a copy stream, in bytes.
const MaxCopyPathLen = 4096

// ManifestEntry is one entry the receiver already has.
type ManifestEntry struct {
	Path    string `json:"path"`
	Type    string `json:"type"`
	Size    int64  `json:"size,omitempty"`
	Mode    uint32 `json:"mode"`     // permission bits (0o7777)
	MtimeNS int64  `json:"mtime_ns"` // modification time, ns since the epoch
	// XXH128 is the XXH3-128 digest of a regular file (32 hex digits, high
	// half first), present only when the copy asked for checksums.
	XXH128 string `json:"xxh128,omitempty"`
}

// ManifestEnd closes the receiver's manifest.
type ManifestEnd struct {
	// Exists says whether the destination exists; Type is its type.
	Exists bool   `json:"exists"`
	Type   string `json:"type,omitempty"`
	// Entries counts the manifest entries sent, to detect loss.
	Entries int `json:"entries"`
}

// CopyEntry is one entry of the source tree, in the sender's walk order
// (parents before children).
type CopyEntry struct {
	Path    string `json:"path"`
	Type    string `json:"type"`
	Mode    uint32 `json:"mode"` // permission bits (0o7777)
	MtimeNS int64  `json:"mtime_ns"`
	// Size is a regular file's length in bytes.
	Size int64 `json:"size,omitempty"`
	// Link is a symlink's target, verbatim.
	Link string `json:"link,omitempty"`
	// Keep says the receiver's copy is already identical: no data follows.
	Keep bool `json:"keep,omitempty"`
	// TotalFiles and TotalBytes are set on the root entry only: how many
	// file entries the source has and how many data bytes will follow
	// (the files whose content travels), so the receiver can report
	// progress. Optional; zero means unknown.
	TotalFiles int   `json:"total_files,omitempty"`
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Name is the source's base name, on the root entry only: a file copied
	// onto a directory (or with CopyParams.Into) lands at DST/Name.
	Name string `json:"name,omitempty"`
}

// Validate checks e's path, type and fields.
func (e *CopyEntry) Validate() error {
	if err := ValidCopyPath(e.Path); err != nil {
		return err
	}
	switch e.Type {
	case EntryDir, EntryFile:
		if e.Link != "" {
			return fmt.Errorf("copy entry %q: a %s has no link target", e.Path, e.Type)
		}
	case EntrySymlink:
		if e.Link == "" || len(e.Link) > MaxCopyPathLen || strings.ContainsRune(e.Link, 0) {
			return fmt.Errorf("copy entry %q: symlink target is empty, too long or contains NUL", e.Path)
		}
		if e.Path == "." {
			return fmt.Errorf("copy entry %q: the copy's root cannot be a symlink", e.Path)
		}
	default:
		return fmt.Errorf("copy entry %q: unknown type %q", e.Path, e.Type)
	}
	if e.Size < 0 || (e.Type != EntryFile && e.Size != 0) {
		return fmt.Errorf("copy entry %q: bad size %d for a %s", e.Path, e.Size, e.Type)
	}
	if e.Mode&^0o7777 != 0 {
		return fmt.Errorf("copy entry %q: mode %o has bits outside 07777", e.Path, e.Mode)
	}
	if e.TotalFiles < 0 || e.TotalBytes < 0 || (e.Path != "." && (e.TotalFiles != 0 || e.TotalBytes != 0)) {
		return fmt.Errorf("copy entry %q: totals are only allowed, non-negative, on the root entry", e.Path)
	}
	if e.Keep && e.Type != EntryFile {
		return fmt.Errorf("copy entry %q: only files can be kept", e.Path)
	}
	if e.Name != "" && (e.Path != "." || ValidCopyPath(e.Name) != nil || strings.Contains(e.Name, "/")) {
		return fmt.Errorf("copy entry %q: name %q must be one path component, on the root entry only", e.Path, Clip(e.Name))
	}
	return nil
}

// EntryEnd closes a file entry's data.
type EntryEnd struct {
	XXH128 string `json:"xxh128"` // XXH3-128 of the bytes sent, as in ManifestEntry
}

// CopyEnd closes the sender's side.
type CopyEnd struct {
	Entries int   `json:"entries"` // FrameEntry frames sent
	Bytes   int64 `json:"bytes"`   // file bytes sent
}

// CopyResult is the receiver's report of a committed copy.
type CopyResult struct {
	Entries      int   `json:"entries"`       // entries in the new tree
	FilesWritten int   `json:"files_written"` // files whose content arrived
	FilesKept    int   `json:"files_kept"`    // files unchanged, not sent
	BytesWritten int64 `json:"bytes_written"`
	Deleted      int   `json:"deleted"` // destination entries removed (--delete)
}

// ValidCopyPath checks a path in a copy stream: "." for the root, else a
// clean, relative, slash-separated path whose components are neither empty,
// ".", nor "..", and without NUL, at most
// MaxCopyPathLen bytes. It is the first of two defences: receivers also open
// every path through an os.Root, which refuses symlink escapes.
func ValidCopyPath(p string) error {
	if p == "." {
		return nil
	}
	if p == "" || len(p) > MaxCopyPathLen {
		return fmt.Errorf("copy path %q: empty or longer than %d bytes", p, MaxCopyPathLen)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("copy path %q: contains NUL", p)
	}
	if path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("copy path %q: must be relative and clean", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("copy path %q: component %q not allowed", p, c)
		}
	}
	return nil
}
