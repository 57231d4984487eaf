package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
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
//     An entry the sender cannot carry (a special file, a file or
//     directory it cannot read, a path longer than MaxCopyPathLen) is
//     named in a FrameCopySkip instead, in walk order, unless the copy is
//     strict, where it fails the copy.
//  3. The receiver verifies every checksum, stages every new or changed
//     entry under a temporary name, puts them all in place at the end, and
//     answers FrameCopyDone (or FrameError). A copy that ends any other way
//     leaves the destination as it was. A FrameError after the renames
//     (CodeCopyFailed) says so: "the new tree is in place, but: ...".
//
// Either side may send FrameError (and the client FrameCancel) at any time
// to abort: with CodeBadRequest for a copy that is not allowed (outside the
// copy roots, the agent's own state) or a stream that breaks this
// protocol, CodeCopyFailed for a copy that failed on a path (missing, not
// permitted, a file system error), other codes for the agent's own
// failures (CodeInternal, CodeBusy). A coordinator relaying the stream
// that shuts down ends it with a FrameError of ResultCodeShutdown. Paths
// are relative to the copy's root, slash separated, and checked with
// ValidCopyPath; the root itself is ".".
//
// Names. A Linux name is any bytes but '/' and NUL, while a JSON string
// holds only UTF-8. Every name field (a path, a symlink target, a base
// name) therefore has a twin with the suffix _b64: a name that is not
// valid UTF-8 travels there in standard base64 (with padding) and the
// plain field is empty. PutName and GetName convert; the types' EncodeNames
// and DecodeNames apply them to every name field.

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
	// copy roots. Any bytes but NUL: one that is not valid UTF-8 travels
	// in path_b64 (MarshalJSON and UnmarshalJSON convert).
	Path string `json:"path"`
	// PathB64 is only set on the wire; decoded params hold Path.
	PathB64 string `json:"path_b64,omitempty"`
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
	// Strict makes the copy all or nothing: an entry the sender cannot
	// carry fails the copy instead of being skipped. The sender applies it:
	// the agent for a pull, the client itself for a push.
	Strict bool `json:"strict,omitempty"`
	// User is the local account on the node the operation runs as: a user
	// name or a decimal uid, with that user's uid, primary and
	// supplementary groups, home and shell. The coordinator sets it from
	// the policy rule that allowed the operation (run_as) and overwrites
	// whatever a client wrote; the agent's local policy decides whether it
	// may run as that user. Empty means the agent's own user.
	User string `json:"user,omitempty"`
	// Roots are the path prefixes of the coordinator's policy rule that
	// granted the copy (its cp.read or cp.write paths), at most
	// MaxCopyRoots, each absolute and clean. The coordinator sets them
	// and overwrites whatever a client wrote, as it does User. The agent
	// resolves Path beneath the intersection of Roots and its own copy
	// roots (each root under a copy root, each copy root under a root),
	// so that symlinks, which the agent otherwise follows within its
	// copy roots, cannot lead a copy out of what the policy granted; a
	// Path under none of them is refused. Empty means no grant narrows
	// the copy roots (a coordinator without a policy).
	Roots []string `json:"roots,omitempty"`
}

// MaxCopyRoots bounds CopyParams.Roots.
const MaxCopyRoots = 64

// FeatureCopyRoots, in Hello.Features: the agent confines a copy to
// CopyParams.Roots. A coordinator sends Roots only to an agent that
// lists it (an older agent refuses params with a field it does not
// know), and refuses a copy whose grant is narrower than "/" on an agent
// that does not: it could not keep the copy inside the grant.
const FeatureCopyRoots = "copy_roots"

// MarshalJSON encodes p with a Path that is not valid UTF-8 in PathB64
// (see "Names" above), so that every byte survives.
func (p CopyParams) MarshalJSON() ([]byte, error) {
	type plain CopyParams
	q := plain(p)
	if q.PathB64 == "" {
		q.Path, q.PathB64 = PutName(q.Path)
	}
	return json.Marshal(q)
}

// UnmarshalJSON decodes p strictly (unknown fields are an error) and moves
// PathB64 back to Path.
func (p *CopyParams) UnmarshalJSON(b []byte) error {
	type plain CopyParams
	var q plain
	// The strict walker treats a type with its own UnmarshalJSON as one
	// opaque value, so the field rules (exact names, no repeats, UTF-8)
	// are applied here, to the plain shape.
	if err := decodeStrict(b, &q); err != nil {
		return err
	}
	path, err := GetName(q.Path, q.PathB64)
	if err != nil {
		return fmt.Errorf("path: %w", err)
	}
	q.Path, q.PathB64 = path, ""
	*p = CopyParams(q)
	return nil
}

// Validate reports every problem with p.
func (p *CopyParams) Validate() error {
	var errs []error
	if p.Direction != CopyPush && p.Direction != CopyPull {
		errs = append(errs, fmt.Errorf("direction %q: want %q or %q", p.Direction, CopyPush, CopyPull))
	}
	np, err := GetName(p.Path, p.PathB64)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("path: %w", err))
	case !path.IsAbs(np):
		errs = append(errs, fmt.Errorf("path %s: must be absolute", Clip(np)))
	default:
		if err := checkCopyPath(np); err != nil {
			errs = append(errs, fmt.Errorf("path: %w", err))
		}
	}
	errs = append(errs, checkUser(p.User)...)
	if len(p.Roots) > MaxCopyRoots {
		errs = append(errs, fmt.Errorf("roots: %d, at most %d", len(p.Roots), MaxCopyRoots))
	} else {
		for i, r := range p.Roots {
			switch err := checkCopyPath(r); {
			case err != nil:
				errs = append(errs, fmt.Errorf("roots[%d]: %w", i, err))
			case !path.IsAbs(r):
				errs = append(errs, fmt.Errorf("roots[%d] %s: must be absolute", i, Clip(r)))
			case path.Clean(r) != r:
				errs = append(errs, fmt.Errorf("roots[%d] %s: must be clean (%s)", i, Clip(r), path.Clean(r)))
			}
		}
	}
	return errors.Join(errs...)
}

// checkCopyPath says which of a copy path's bounds p breaks, if any: its
// length (at most MaxCopyPathLen bytes) or a NUL byte (its 1-based byte
// position), which no system call takes.
func checkCopyPath(p string) error {
	if len(p) > MaxCopyPathLen {
		return fmt.Errorf("%d bytes, over the limit of %d", len(p), MaxCopyPathLen)
	}
	if i := strings.IndexByte(p, 0); i >= 0 {
		return fmt.Errorf("a NUL byte at byte %d of %d", i+1, len(p))
	}
	return nil
}

// PutName returns the wire form of a name (see "Names" above): (name, "")
// when name is valid UTF-8, else ("", its base64).
func PutName(name string) (plain, b64 string) {
	if utf8.ValidString(name) {
		return name, ""
	}
	return "", base64.StdEncoding.EncodeToString([]byte(name))
}

// GetName returns the name a (plain, b64) pair carries. It fails if both
// are set or b64 is not base64.
func GetName(plain, b64 string) (string, error) {
	if b64 == "" {
		return plain, nil
	}
	if plain != "" {
		return "", fmt.Errorf("name %s has both a plain and a base64 form", Clip(plain))
	}
	if len(b64) > base64.StdEncoding.EncodedLen(MaxCopyPathLen) {
		return "", fmt.Errorf("base64 name longer than %d bytes", MaxCopyPathLen)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", fmt.Errorf("base64 name %s: %w", Clip(b64), err)
	}
	return string(b), nil
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
	PathB64 string `json:"path_b64,omitempty"` // see "Names" above
	Type    string `json:"type"`
	Size    int64  `json:"size,omitempty"`
	Mode    uint32 `json:"mode"`     // permission bits (0o7777)
	MtimeNS int64  `json:"mtime_ns"` // modification time, ns since the epoch
	// XXH128 is the XXH3-128 digest of a regular file (32 hex digits, high
	// half first), present only when the copy asked for checksums.
	XXH128 string `json:"xxh128,omitempty"`
}

// EncodeNames moves a Path that is not valid UTF-8 to PathB64.
func (e *ManifestEntry) EncodeNames() { e.Path, e.PathB64 = PutName(e.Path) }

// DecodeNames moves PathB64 back to Path.
func (e *ManifestEntry) DecodeNames() error {
	p, err := GetName(e.Path, e.PathB64)
	if err != nil {
		return fmt.Errorf("manifest entry: path: %w", err)
	}
	e.Path, e.PathB64 = p, ""
	return nil
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
	PathB64 string `json:"path_b64,omitempty"` // see "Names" above
	Type    string `json:"type"`
	Mode    uint32 `json:"mode"` // permission bits (0o7777)
	MtimeNS int64  `json:"mtime_ns"`
	// Size is a regular file's length in bytes.
	Size int64 `json:"size,omitempty"`
	// Link is a symlink's target, verbatim.
	Link    string `json:"link,omitempty"`
	LinkB64 string `json:"link_b64,omitempty"`
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
	Name    string `json:"name,omitempty"`
	NameB64 string `json:"name_b64,omitempty"`
}

// EncodeNames moves each name field that is not valid UTF-8 to its _b64
// twin.
func (e *CopyEntry) EncodeNames() {
	e.Path, e.PathB64 = PutName(e.Path)
	e.Link, e.LinkB64 = PutName(e.Link)
	e.Name, e.NameB64 = PutName(e.Name)
}

// DecodeNames moves each _b64 twin back to its name field.
func (e *CopyEntry) DecodeNames() error {
	var err error
	if e.Path, err = GetName(e.Path, e.PathB64); err != nil {
		return fmt.Errorf("copy entry: path: %w", err)
	}
	if e.Link, err = GetName(e.Link, e.LinkB64); err != nil {
		return fmt.Errorf("copy entry %s: link: %w", Clip(e.Path), err)
	}
	if e.Name, err = GetName(e.Name, e.NameB64); err != nil {
		return fmt.Errorf("copy entry %s: name: %w", Clip(e.Path), err)
	}
	e.PathB64, e.LinkB64, e.NameB64 = "", "", ""
	return nil
}

// Validate checks e's path, type and fields.
func (e *CopyEntry) Validate() error {
	if err := ValidCopyPath(e.Path); err != nil {
		return err
	}
	switch e.Type {
	case EntryDir, EntryFile:
		if e.Link != "" {
			return fmt.Errorf("copy entry %s: a %s has no link target", Clip(e.Path), e.Type)
		}
	case EntrySymlink:
		if e.Link == "" || len(e.Link) > MaxCopyPathLen || strings.ContainsRune(e.Link, 0) {
			return fmt.Errorf("copy entry %s: symlink target is empty, too long or contains NUL", Clip(e.Path))
		}
		if e.Path == "." {
			return fmt.Errorf("copy entry %s: the copy's root cannot be a symlink", Clip(e.Path))
		}
	default:
		return fmt.Errorf("copy entry %s: unknown type %s", Clip(e.Path), Clip(e.Type))
	}
	if e.Size < 0 || (e.Type != EntryFile && e.Size != 0) {
		return fmt.Errorf("copy entry %s: bad size %d for a %s", Clip(e.Path), e.Size, e.Type)
	}
	if e.Mode&^0o7777 != 0 {
		return fmt.Errorf("copy entry %s: mode %o has bits outside 07777", Clip(e.Path), e.Mode)
	}
	if e.TotalFiles < 0 || e.TotalBytes < 0 || (e.Path != "." && (e.TotalFiles != 0 || e.TotalBytes != 0)) {
		return fmt.Errorf("copy entry %s: totals are only allowed, non-negative, on the root entry", Clip(e.Path))
	}
	if e.Keep && e.Type != EntryFile {
		return fmt.Errorf("copy entry %s: only files can be kept", Clip(e.Path))
	}
	if e.Name != "" && (e.Path != "." || ValidCopyPath(e.Name) != nil || strings.Contains(e.Name, "/")) {
		return fmt.Errorf("copy entry %s: name %s must be one path component, on the root entry only", Clip(e.Path), Clip(e.Name))
	}
	return nil
}

// EntryEnd closes a file entry's data.
type EntryEnd struct {
	XXH128 string `json:"xxh128"` // XXH3-128 of the bytes sent, as in ManifestEntry
}

// CopySkip names an entry of the source the sender could not carry and
// says why (FrameCopySkip). The receiver leaves whatever the destination
// has at Path (and below it) as it is, even with CopyParams.Delete.
type CopySkip struct {
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"` // see "Names" above
	// Reason says why, for people: "named pipe: special files are not
	// copied", "open: permission denied".
	Reason string `json:"reason"`
}

// EncodeNames moves a Path that is not valid UTF-8 to PathB64.
func (s *CopySkip) EncodeNames() { s.Path, s.PathB64 = PutName(s.Path) }

// DecodeNames moves PathB64 back to Path.
func (s *CopySkip) DecodeNames() error {
	p, err := GetName(s.Path, s.PathB64)
	if err != nil {
		return fmt.Errorf("copy skip: path: %w", err)
	}
	s.Path, s.PathB64 = p, ""
	return nil
}

// Validate checks the skip's path (ValidCopyPath) and reason.
func (s *CopySkip) Validate() error {
	if err := ValidCopyPath(s.Path); err != nil {
		return fmt.Errorf("copy skip: %w", err)
	}
	if len(s.Reason) > 1024 {
		return fmt.Errorf("copy skip %s: reason longer than 1024 bytes", Clip(s.Path))
	}
	return nil
}

// MaxReportedSkips bounds CopyResult.SkippedEntries; CopyResult.Skipped
// counts them all.
const MaxReportedSkips = 100

// CopyEnd closes the sender's side.
type CopyEnd struct {
	Entries int   `json:"entries"`           // FrameEntry frames sent
	Bytes   int64 `json:"bytes"`             // file bytes sent
	Skipped int   `json:"skipped,omitempty"` // FrameCopySkip frames sent
}

// CopyResult is the receiver's report of a committed copy.
type CopyResult struct {
	Entries      int   `json:"entries"`       // entries in the new tree
	FilesWritten int   `json:"files_written"` // files whose content arrived
	FilesKept    int   `json:"files_kept"`    // files unchanged, not sent
	BytesWritten int64 `json:"bytes_written"`
	Deleted      int   `json:"deleted"` // destination entries removed (--delete)
	// Replaced counts the destination entries replaced by a source entry
	// of another type (a file by a directory, an empty directory by a
	// file, ...); the entries a replaced directory held are counted in
	// Deleted.
	Replaced int `json:"replaced,omitempty"`
	// Skipped counts the source entries the sender could not carry: a
	// copy with Skipped > 0 is partial. SkippedEntries names the first
	// MaxReportedSkips of them, in walk order.
	Skipped        int        `json:"skipped,omitempty"`
	SkippedEntries []CopySkip `json:"skipped_entries,omitempty"`
}

// EncodeNames encodes the names of r.SkippedEntries (see "Names" above),
// in a copy of the slice.
func (r *CopyResult) EncodeNames() {
	if len(r.SkippedEntries) == 0 {
		return
	}
	r.SkippedEntries = append([]CopySkip(nil), r.SkippedEntries...)
	for i := range r.SkippedEntries {
		r.SkippedEntries[i].EncodeNames()
	}
}

// DecodeNames decodes the names of r.SkippedEntries.
func (r *CopyResult) DecodeNames() error {
	for i := range r.SkippedEntries {
		if err := r.SkippedEntries[i].DecodeNames(); err != nil {
			return err
		}
	}
	return nil
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
		return fmt.Errorf("copy path %s: empty or longer than %d bytes", Clip(p), MaxCopyPathLen)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("copy path %s: contains NUL", Clip(p))
	}
	if path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("copy path %s: must be relative and clean", Clip(p))
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("copy path %s: component %s not allowed", Clip(p), Clip(c))
		}
	}
	return nil
}
