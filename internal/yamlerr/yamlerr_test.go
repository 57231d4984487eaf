package yamlerr

import (
	"testing"

	"go.yaml.in/yaml/v3"
)

func decodeErr(t *testing.T, data string) error {
	t.Helper()
	var n yaml.Node
	err := yaml.Unmarshal([]byte(data), &n)
	if err == nil {
		t.Fatalf("%q decoded", data)
	}
	return err
}

func TestSyntax(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		// yaml.v3 says "invalid leading UTF-8 octet", with no position.
		{"role: agent\n\xff\xfe: x\n", "f.yaml:2:1: not UTF-8 text (byte 0xff); YAML files are UTF-8"},
		{"a: 1\nb: \"x\xc3\"\n", "f.yaml:2:6: not UTF-8 text (byte 0xc3); YAML files are UTF-8"},
		{"a:\n\tb: 1\n", "f.yaml:2: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{"a: [1\n", "f.yaml:1: did not find expected ',' or ']'"},
	} {
		if got := Syntax("f.yaml", []byte(tc.data), decodeErr(t, tc.data)).Error(); got != tc.want {
			t.Errorf("Syntax(%q) = %q, want %q", tc.data, got, tc.want)
		}
	}
}

func FuzzInvalidUTF8(f *testing.F) {
	f.Add([]byte("a\n\xff"))
	f.Add([]byte("ok"))
	f.Fuzz(func(t *testing.T, data []byte) {
		line, col, ok := InvalidUTF8(data)
		if !ok {
			return
		}
		i := offset(data, line, col)
		if i < 0 || i >= len(data) {
			t.Fatalf("position %d:%d is outside the data (offset %d)", line, col, i)
		}
	})
}
