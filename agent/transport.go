package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/tunnel"
)

// Transports: how the agent reaches a coordinator address (Config.Transports).
const (
	// TransportTLS is raw TLS to the coordinator's tunnel port.
	TransportTLS = "tls"
	// TransportWebSocket is the WebSocket transport over TLS to the same
	// port (tunnel.WebSocketDialer), through the HTTPS proxy of the
	// environment (Config.Proxy).
	TransportWebSocket = "wss"
)

// knownTransports lists the transports in the order metrics pre-create
// their labels.
var knownTransports = []string{TransportTLS, TransportWebSocket}

// validateTransports reports unknown or repeated entries of Transports.
func validateTransports(ts []string) []error {
	var errs []error
	for i, t := range ts {
		if !slices.Contains(knownTransports, t) {
			errs = append(errs, fmt.Errorf("agent config: Transports: %q is not a transport (want %s)", t, strings.Join(knownTransports, " or ")))
		} else if slices.Index(ts, t) != i {
			errs = append(errs, fmt.Errorf("agent config: Transports: %q is listed twice", t))
		}
	}
	return errs
}

// dialedTransport is the transport of the connection dialTransports
// returned last ("" with Config.Dial): the Redialer serves each connection
// right after dialing it, in the same goroutine. The connection itself is
// not wrapped, so that the session finds the TLS (or WebSocket) connection
// it writes frames through in one system call (tunnel.Cork).
func (a *Agent) dialedTransport() string {
	if a.cfg.Dial != nil {
		return ""
	}
	if t := a.lastTransport.Load(); t != nil {
		return *t
	}
	return ""
}

// dialTransports dials addr with each of Config.Transports in turn, the one
// that last connected first, each within Config.HandshakeTimeout, until one
// connects. A busy refusal (the coordinator is up and asks the agent to
// come back) is returned at once: another transport to the same
// coordinator would be refused too. Failures are joined, each naming its
// transport.
func (a *Agent) dialTransports(ctx context.Context, addr string) (net.Conn, error) {
	order := a.transportOrder()
	var errs []error
	for i, t := range order {
		dctx, cancel := context.WithTimeout(ctx, a.cfg.HandshakeTimeout)
		conn, err := a.dialTransport(dctx, t, addr)
		cancel()
		if err == nil {
			a.lastTransport.Store(&t)
			return conn, nil
		}
		var busy *tunnel.RetryAfterError
		if errors.As(err, &busy) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", t, err))
		if i+1 < len(order) {
			a.log.Info("coordinator transport failed; trying the next one", "addr", addr, "transport", t, "next", order[i+1], "err", err)
		}
	}
	return nil, errors.Join(errs...)
}

// transportOrder is Config.Transports with the one that last connected
// first: an agent whose network lets only the proxy out does not wait for a
// raw TLS dial to fail at every reconnect.
func (a *Agent) transportOrder() []string {
	order := a.cfg.Transports
	last := a.lastTransport.Load()
	if last == nil || order[0] == *last || !slices.Contains(order, *last) {
		return order
	}
	out := []string{*last}
	for _, t := range order {
		if t != *last {
			out = append(out, t)
		}
	}
	return out
}

// dialTransport dials addr with transport t.
func (a *Agent) dialTransport(ctx context.Context, t, addr string) (net.Conn, error) {
	// Built per dial: the certificate, once there is one, and the CA
	// pinned at enrollment (identity.go).
	switch t {
	case TransportWebSocket:
		d := tunnel.WebSocketDialer{TLS: a.tlsConfig(), Path: a.cfg.WebSocketPath, Proxy: a.cfg.Proxy, PingInterval: a.cfg.WebSocketPing}
		return d.Dial(ctx, addr)
	default:
		return tunnel.DialTLS(ctx, addr, a.tlsConfig())
	}
}

// setTransportMetric marks t as the transport of the live session (none
// when t is "").
func (a *Agent) setTransportMetric(t string) {
	for _, k := range knownTransports {
		v := 0.0
		if k == t {
			v = 1
		}
		a.m.transport.WithLabelValues(k).Set(v)
	}
}
