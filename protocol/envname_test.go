package protocol

import (
	"errors"
	"strings"
	"testing"
)

// An env name with a space or a control character is refused: no shell
// can read it, and it carried terminal escapes into logs and listings
// (fresh-user pass fresh20: --env $'X\e]0;T\a=1' and --env 'A B=2' ran).
// Names outside the shell's [A-Za-z_][A-Za-z0-9_]* but without those
// (npm_config_a-b, a.b) are the caller's business and still pass.
func TestEnvNameRefusesSpaceAndControls(t *testing.T) {
	for _, k := range []string{"A B", "X\x1b]0;T\a", "TAB\tX", "DEL\x7f", "NL\n"} {
		errs := checkEnv(map[string]string{k: "1"})
		if err := errors.Join(errs...); err == nil || !strings.Contains(err.Error(), "at byte") {
			t.Errorf("env name %q: %v, want refused naming the byte", k, err)
		}
	}
	for _, k := range []string{"PATH", "_X1", "npm_config_a-b", "a.b", "ÉTÉ"} {
		if errs := checkEnv(map[string]string{k: "v"}); len(errs) != 0 {
			t.Errorf("env name %q refused: %v", k, errs)
		}
	}
}
