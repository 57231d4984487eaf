package cli

// What the client commands share with the daemons' files (config.go,
// dev.go), which the client-only build (-tags tetherclient) leaves out.

import (
	"os"
	"path/filepath"
	"regexp"
	"sync"
)

// intTypes are the pflag types of whole numbers.
var intTypes = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^u?int(8|16|32|64)?$`) })

// typeName is a pflag type in words.
func typeName(typ string) string {
	switch {
	case typ == "bool":
		return "a boolean (true or false)"
	case typ == "string":
		return "a string"
	case typ == "duration":
		return "a duration, such as 30s, 5m or 1h30m, or a number of seconds"
	case intTypes().MatchString(typ):
		return "a whole number"
	case typ == "float64" || typ == "float32":
		return "a number"
	case typ == "stringSlice" || typ == "stringArray":
		return "a list of strings"
	}
	return "a " + typ
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// writeFileAtomic writes data to path through a temporary file beside it
// and a rename, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
