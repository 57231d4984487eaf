package cli

import (
	"os"
	"testing"
)

// cliMainEnv makes the test binary run as tether itself (its arguments are
// tether's, through Main as cmd/tether runs it: signals included), so that
// an OpenSSH ProxyCommand written by tether ssh-config, which names
// os.Executable, works in tests, and tests can run whole tether processes.
const cliMainEnv = "TETHER_CLI_TEST_AS_TETHER"

func TestMain(m *testing.M) {
	if os.Getenv(cliMainEnv) == "1" {
		os.Exit(Main())
	}
	os.Exit(m.Run())
}
