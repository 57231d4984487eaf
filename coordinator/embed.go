package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tetherfleet/tether/natsauth"
)

// EmbeddedNATSConfig configures the nats-server a coordinator embeds when it
// is given no external NATS (tether dev, single-node installs).
type EmbeddedNATSConfig struct {
	// Host is the client listen address. Default "127.0.0.1".
	Host string
	// Port is the client port. -1 (server.RANDOM_PORT) picks a free port;
	// 0 means NATS's default, 4222.
	Port int
	// StoreDir is the JetStream store directory. Required.
	StoreDir string
	// Auth is the NATS layout the server enforces (Layout.ConfigureServer):
	// every client must present a user JWT of it; there are no anonymous
	// clients. Required.
	Auth *natsauth.Layout
	// ServerName names the server in NATS monitoring and JetStream. Default:
	// chosen by nats-server.
	ServerName string
	// SyncAlways fsyncs every JetStream write (sync_interval: always), as
	// the job store wants: a job accepted is on disk. Off: the server's
	// default (every 2 minutes).
	SyncAlways bool
	// Logger receives the server's logs (notices at info, warnings, errors;
	// debug when the logger has debug enabled; traces never). Nil silences
	// the server.
	Logger *slog.Logger
}

// StartEmbeddedNATS starts a nats-server with JetStream, authenticating
// every client by cfg.Auth, and waits up to 10 s for it to accept
// connections. It installs no signal handlers. The caller
// owns the server: Shutdown then WaitForShutdown stops it. Clients reach it at
// s.ClientURL().
func StartEmbeddedNATS(cfg EmbeddedNATSConfig) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded NATS: StoreDir is required")
	}
	if cfg.Auth == nil {
		return nil, errors.New("embedded NATS: Auth (the NATS layout) is required: the server never admits anonymous clients")
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	opts := &server.Options{
		Host:       host,
		Port:       cfg.Port,
		ServerName: cfg.ServerName,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      cfg.Logger == nil,
		SyncAlways: cfg.SyncAlways,
	}
	if err := cfg.Auth.ConfigureServer(opts); err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	// nats-server only logs a failed bind and then never becomes ready; try
	// the address first so a busy port is reported at once, by its cause.
	if cfg.Port > 0 {
		addr := net.JoinHostPort(host, strconv.Itoa(cfg.Port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("embedded NATS: %w", err)
		}
		ln.Close()
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS on %s:%d: %w", host, cfg.Port, err)
	}
	if cfg.Logger != nil {
		debug := cfg.Logger.Enabled(context.Background(), slog.LevelDebug)
		s.SetLoggerV2(&natsLogger{l: cfg.Logger.With("component", "nats-server")}, debug, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded NATS on %s:%d: not ready for connections within 10s", host, cfg.Port)
	}
	return s, nil
}

// natsLogger bridges nats-server's printf Logger to slog.
type natsLogger struct{ l *slog.Logger }

var _ server.Logger = (*natsLogger)(nil)

func (n *natsLogger) Noticef(format string, v ...any) { n.l.Info(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }

// Fatalf logs at error level: nats-server returns after a fatal condition
// (and StartEmbeddedNATS then reports it) instead of the process exiting.
func (n *natsLogger) Fatalf(format string, v ...any) {
	n.l.Error(fmt.Sprintf(format, v...), "fatal", true)
}
func (n *natsLogger) Errorf(format string, v ...any) { n.l.Error(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Debugf(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Tracef(format string, v ...any) {
	n.l.Debug(fmt.Sprintf(format, v...), "trace", true)
}
