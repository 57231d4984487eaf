package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsoleTokens: --console-token-file takes the facade token file's
// format; a missing or bad file is an error naming it, never the token.
func TestConsoleTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := consoleOptions{}
	if tokens, err := o.tokens(); tokens != nil || err != nil {
		t.Fatalf("no file: %v %v, want no tokens", tokens != nil, err)
	}
	o.TokenFile = write("named", "# console\nops ops-token-0123456789abcdef\nci ci-token-0123456789abcdef\n")
	tokens, err := o.tokens()
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]string{"ops-token-0123456789abcdef": "ops", "ci-token-0123456789abcdef": "ci", "other-token-0123456789abcdef": "", "": ""} {
		if name, ok := tokens(tok); name != want || ok != (want != "") {
			t.Errorf("tokens(%q) = %q, %v; want %q", tok, name, ok, want)
		}
	}
	o.TokenFile = write("bare", "bare-token-0123456789abcdef\n")
	if tokens, err = o.tokens(); err != nil {
		t.Fatal(err)
	}
	if name, ok := tokens("bare-token-0123456789abcdef"); !ok || name != defaultTokenName {
		t.Errorf("a bare token is %q %v, want %q", name, ok, defaultTokenName)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"short", "ops short\n", "at least"},
		{"dup", "a tok-0123456789abcdef\nb tok-0123456789abcdef\n", "each holder needs its own"},
	} {
		o.TokenFile = write(tc.name, tc.body)
		_, err := o.tokens()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), o.TokenFile) || strings.Contains(err.Error(), "tok-0123456789abcdef") {
			t.Errorf("%s: %v; want an error naming the file and %q, not the token", tc.name, err, tc.want)
		}
	}
	o.TokenFile = filepath.Join(dir, "missing")
	if _, err := o.tokens(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing file: %v", err)
	}
}
