// Package yamlerr places a yaml.v3 syntax error in its file, for every
// YAML file Tether reads (the config file, the coordinator's policy, a
// node's local policy): "FILE:LINE: problem" when yaml.v3 names a line,
// with a hint where its wording says little (a tab in the indentation),
// and "FILE:LINE:COLUMN: ..." for bytes that are not UTF-8, which yaml.v3
// reports without a position.
package yamlerr

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// yamlLine matches the position yaml.v3 puts in its syntax errors;
// compiled on the first syntax error, not at start-up.
var yamlLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^line (\d+): (.*)$`) })

// Syntax returns err, a yaml.v3 decoding error of data read from file,
// placed in the file. Its text is never longer than err's by more than
// the position and a hint.
func Syntax(file string, data []byte, err error) error {
	if line, col, ok := InvalidUTF8(data); ok {
		return fmt.Errorf("%s:%d:%d: not UTF-8 text (byte 0x%02x); YAML files are UTF-8", file, line, col, data[offset(data, line, col)])
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	m := yamlLine().FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("%s: %s", file, msg)
	}
	n, _ := strconv.Atoi(m[1])
	if lines := strings.Split(string(data), "\n"); n >= 1 && n <= len(lines) {
		l := lines[n-1]
		if indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]; strings.Contains(indent, "\t") {
			m[2] += " (a tab: YAML indents with spaces only)"
		}
	}
	return fmt.Errorf("%s:%s: %s", file, m[1], m[2])
}

// InvalidUTF8 reports the position (1-based line, and column in bytes) of
// the first byte of data that is not UTF-8, if any.
func InvalidUTF8(data []byte) (line, col int, ok bool) {
	if utf8.Valid(data) {
		return 0, 0, false
	}
	line, start := 1, 0
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return line, i - start + 1, true
		}
		if r == '\n' {
			line, start = line+1, i+1
		}
		i += size
	}
	return 0, 0, false
}

// offset is the byte offset of line:col in data (both from InvalidUTF8).
func offset(data []byte, line, col int) int {
	i := 0
	for l := 1; l < line; l++ {
		i += strings.IndexByte(string(data[i:]), '\n') + 1
	}
	return i + col - 1
}
