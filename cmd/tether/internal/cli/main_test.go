package cli

import (
	"context"
	"os"
	"testing"
)

// cliMainEnv makes the test binary run as tether itself (its arguments are
// tether's), so that an OpenSSH ProxyCommand written by tether ssh-config,
// which names os.Executable, works in tests.
const cliMainEnv = "TETHER_CLI_TEST_AS_TETHER"

func TestMain(m *testing.M) {
	if os.Getenv(cliMainEnv) == "1" {
		os.Exit(Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
