package agent

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary is also the OpenSSH tests' ProxyCommand
	// (ssh_openssh_test.go).
	if addr := os.Getenv(sshProxyEnv); addr != "" {
		os.Exit(runSSHProxy(addr))
	}
	goleak.VerifyTestMain(m)
}
