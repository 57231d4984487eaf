package cli

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/policy"
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

// TestConsoleNoLoopback: --console-no-loopback gives a loopback caller
// without credentials no identity at all (401), for a coordinator behind
// a proxy on its host that adds no X-Forwarded-For (review F13); without
// it the same caller is the local user (here: admin).
func TestConsoleNoLoopback(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer uids are learnt on Linux only")
	}
	for _, off := range []bool{false, true} {
		o := testCoordinatorOptions(t, t.TempDir())
		if off {
			fs := pflag.NewFlagSet("coordinator", pflag.ContinueOnError)
			o.Console.addFlags(fs)
			if err := fs.Parse([]string{"--console-no-loopback"}); err != nil {
				t.Fatal(err)
			}
		}
		o.Sandbox.local = func(uint32) policy.Identity { return policy.Identity{Kind: policy.KindNATS, Name: "tester"} }
		cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		serveCoordinator(t, cs)
		resp, err := http.Get("http://" + cs.info.AdminAddr + "/console/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case off && (resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "nats:tester")):
			t.Errorf("--console-no-loopback, a loopback caller without credentials: %d, want 401 without an identity:\n%s", resp.StatusCode, body)
		case !off && !strings.Contains(string(body), "nats:tester"):
			t.Errorf("a loopback caller without credentials: %d, want the local user nats:tester:\n%s", resp.StatusCode, body)
		}
	}
}
