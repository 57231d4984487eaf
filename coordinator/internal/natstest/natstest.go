// Package natstest runs a real, embedded nats-server for the coordinator's
// tests, as nats-server's own tests do, with Tether's NATS layout: no
// anonymous client gets in (natsauth/natsauthtest). Only _test.go files may
// import it; the production embedded server is coordinator.StartEmbeddedNATS.
package natstest

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

// Env is the running server and its layout: Env.Coordinator connects with
// coordinator (TETHER) credentials, Env.Client as a client user.
type Env = natsauthtest.Env

// Run starts a nats-server with JetStream on 127.0.0.1 and a random port,
// with logging off and no signal handlers, its store in a temporary
// directory, authenticating by a fresh layout. The server is shut down when
// the test ends. Each mutate function may adjust the options (e.g.
// MaxPayload) before the server starts.
func Run(tb testing.TB, mutate ...func(*server.Options)) *Env {
	tb.Helper()
	return natsauthtest.Run(tb, mutate...)
}
