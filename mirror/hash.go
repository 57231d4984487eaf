package mirror

import (
	"encoding/hex"

	"github.com/zeebo/xxh3"
)

// The whole-file checksum of copies is XXH3-128, the checksum rsync (3.2 and
// later) uses by default. It catches corruption, torn reads and files that
// change while they are sent; it is not meant to resist an adversary, which
// TLS and the tunnel's authentication keep out. On this project's reference
// machine it hashes at about 34 GB/s against SHA-256's 1.3 GB/s (with SHA-NI),
// which matters because every byte of a copy is hashed on both ends.

// newFileHash returns a fresh whole-file hasher.
func newFileHash() *xxh3.Hasher { return xxh3.New() }

// hashHex returns h's 128-bit digest as 32 lowercase hex digits (high half
// first).
func hashHex(h *xxh3.Hasher) string {
	b := h.Sum128().Bytes()
	return hex.EncodeToString(b[:])
}
