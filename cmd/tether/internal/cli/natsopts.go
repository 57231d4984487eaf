package cli

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
)

// Where client commands find NATS when --nats-url is not given.
const (
	natsURLEnv     = "TETHER_NATS_URL"
	defaultNATSURL = "nats://127.0.0.1:4222"
)

// natsOptions are the connection flags of the client commands.
type natsOptions struct {
	// URL is the NATS server URL (comma-separated for several). Empty means
	// $TETHER_NATS_URL, else nats://127.0.0.1:4222.
	URL string
	// Creds is a NATS credentials file. Optional.
	Creds string
}

func (o *natsOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.URL, "nats-url", o.URL, "NATS server URL (default: $"+natsURLEnv+", else "+defaultNATSURL+")")
	cmd.Flags().StringVar(&o.Creds, "nats-creds", o.Creds, "NATS credentials file")
}

// resolveURL applies the precedence --nats-url, $TETHER_NATS_URL, default.
func (o *natsOptions) resolveURL(getenv func(string) string) string {
	if o.URL != "" {
		return o.URL
	}
	if u := getenv(natsURLEnv); u != "" {
		return u
	}
	return defaultNATSURL
}

// connect opens the NATS connection of a client command. The caller closes
// it.
func (o *natsOptions) connect(getenv func(string) string) (*client.Client, func(), error) {
	url := o.resolveURL(getenv)
	opts := []nats.Option{nats.Name("tether-cli " + version), nats.Timeout(5 * time.Second)}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w (is a coordinator or `tether dev` running? set --nats-url or %s)", url, err, natsURLEnv)
	}
	return client.New(nc), nc.Close, nil
}
