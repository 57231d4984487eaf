package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// printable returns text with every rune strconv.Quote would escape for
// not being printable, and every byte that is not UTF-8, replaced by that
// escape in Go's notation, and the rest (é, 日本, …) as it is: C0
// controls (\n, \t, \r, \a, \x1b), DEL (\x7f), C1 controls (\u0085,
// \u009b), bidi controls (\u202e, \u2066) and other invisible format
// characters (\u200b), non-ASCII spaces (\u00a0), and bytes that are not
// UTF-8 (\xff). It is how every human-readable output shows what another
// user, an agent or a file system wrote (a job's command, a copy path, an
// identity, a node id or label, a sandbox's name, an error message), so
// that it cannot move the cursor, rewrite the line or the screen, set the
// clipboard (OSC 52), reorder what follows, or add lines or table cells.
// --json output is exact instead: JSON escapes what it must.
func printable(text string) string {
	i := 0
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if r < utf8.RuneSelf && r >= 0x20 && r != 0x7f || r != utf8.RuneError && strconv.IsPrint(r) {
			i += size
			continue
		}
		break
	}
	if i == len(text) {
		return text // the common case: nothing to escape
	}
	var b strings.Builder
	b.WriteString(text[:i])
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, text[i])
		case strconv.IsPrint(r):
			b.WriteString(text[i : i+size])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// writeRow writes one line of a tabwriter table: the cells, each
// printable, separated by tabs. A cell therefore never holds a tab or a
// newline of its own that would shift the columns or start a row.
func writeRow(w io.Writer, cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	io.WriteString(w, strings.Join(cells, "\t")+"\n")
}
