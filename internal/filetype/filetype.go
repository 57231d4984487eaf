// Package filetype names a file's type for error messages, so that every
// refusal of a file that is not what it should be says what it is.
package filetype

import "os"

// Of names m's type: "a directory", "a named pipe", "a socket", "a
// character device", "a block device", "a symbolic link", or, for a
// regular file or anything else, "mode " and the mode's string.
func Of(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "mode " + m.String()
}
