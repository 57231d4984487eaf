//go:build tetherclient

package cli

// The client-only build (-tags tetherclient; `make build-client` →
// bin/tether-client): the client commands of topCommands, with the same
// flags, output and exit codes as in the full build, and none of the
// daemons' code. The files that start with `//go:build !tetherclient`
// (the coordinator, the agent, dev, the console, the config, policy and
// nats commands, and what only they use) are not compiled, so neither the
// coordinator and agent packages nor nats-server, gRPC, prometheus or
// x/crypto/ssh are linked, and none of their package initialisation runs
// at start-up (issue 12).

import (
	"fmt"

	"github.com/spf13/cobra"
)

// rootBuildNote ends the root command's help: which commands this build
// leaves out.
const rootBuildNote = `

This is the client-only build of tether: coordinator, agent, dev, policy,
config and nats need the full build.`

// The constructors of the commands only the full build links: each builds
// fullBuildOnly's stand-in, so topCommands names them in both builds.
var (
	newCoordinatorCmd = fullBuildOnly("coordinator")
	newAgentCmd       = fullBuildOnly("agent")
	newDevCmd         = fullBuildOnly("dev")
	newPolicyCmd      = fullBuildOnly("policy")
	newConfigCmd      = fullBuildOnly("config")
	newNATSCmd        = fullBuildOnly("nats")
)

// fullBuildOnly returns the constructor of the client build's stand-in for
// the full build's command name: a hidden command (help and shell
// completion do not list it) that takes any arguments and flags (its own
// --help too) and ends with exit code 2, as an unknown command does,
// having done nothing. `tether help NAME` prints the same message.
func fullBuildOnly(name string) func(*env) *cobra.Command {
	return func(e *env) *cobra.Command {
		err := fmt.Errorf("this is the client-only build of tether (built with -tags tetherclient); `tether %s` needs the full build (make build: bin/tether)", name)
		cmd := &cobra.Command{
			Use:                name,
			Short:              "Needs the full build of tether",
			Hidden:             true,
			DisableFlagParsing: true,
			RunE: e.runE(func(*cobra.Command, []string) error {
				return &exitError{code: exitUsage, err: err}
			}),
		}
		cmd.SetHelpFunc(func(c *cobra.Command, _ []string) { printError(c.ErrOrStderr(), err) })
		return cmd
	}
}

// metricsRegistry is the type of env.registry: no command of this build
// registers metrics (the full build's is in coordinator.go).
type metricsRegistry interface{}
