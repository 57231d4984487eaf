package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

const (
	// inventoryPageMax bounds the sandboxes of one FrameInventory page.
	inventoryPageMax = 500
	// inventoryPageBytes bounds a page's encoded sandboxes, leaving room
	// under protocol.MaxFrameSize for the page's own fields.
	inventoryPageBytes = protocol.MaxFrameSize - 4<<10
	// maxGatewayMessage bounds one gRPC message from the OpenShell gateway.
	maxGatewayMessage = 64 << 20
)

// gatewayClients are the clients of the node's gateways that one session's
// inventory and sandbox streams share: a gRPC connection to the OpenShell
// gateway and an HTTP transport for the OpenSandbox server. Each is
// created on first use; close releases them when the session ends. Its
// methods are safe for concurrent use.
type gatewayClients struct {
	cfg *Config

	mu        sync.Mutex
	conn      *grpc.ClientConn // nil until first used
	transport *http.Transport  // nil until first used
	closed    bool
}

// openShell returns a client of the OpenShell gateway, or nil when none is
// configured.
func (g *gatewayClients) openShell() (*gateway.OpenShell, error) {
	o := g.cfg.OpenShell
	if o == nil {
		return nil, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errors.New("gateway clients closed: the session ended")
	}
	if g.conn == nil {
		creds := insecure.NewCredentials()
		if o.TLS != nil {
			creds = credentials.NewTLS(o.TLS)
		}
		d := &net.Dialer{Timeout: g.cfg.DialTimeout}
		// passthrough: the address is dialled as given, with no resolver
		// of its own.
		conn, err := grpc.NewClient("passthrough:///"+o.Addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", addr)
			}),
			// A page of 500 sandboxes with their specs can pass grpc's
			// default 4 MiB.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxGatewayMessage)),
			grpc.WithUserAgent("tether-agent/"+g.cfg.Version))
		if err != nil {
			return nil, fmt.Errorf("openshell gateway %s: %w", o.Addr, err)
		}
		g.conn = conn
	}
	return &gateway.OpenShell{Conn: g.conn, Workspaces: o.Workspaces, Token: o.Token}, nil
}

// openSandbox returns a client of the OpenSandbox server, or nil when none
// is configured.
func (g *gatewayClients) openSandbox() (*gateway.OpenSandbox, error) {
	o := g.cfg.OpenSandbox
	if o == nil {
		return nil, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errors.New("gateway clients closed: the session ended")
	}
	if g.transport == nil {
		d := &net.Dialer{Timeout: g.cfg.DialTimeout}
		// No Proxy: the server is node-local, whatever HTTP_PROXY says.
		g.transport = &http.Transport{
			DialContext:         d.DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	return &gateway.OpenSandbox{HTTP: &http.Client{Transport: g.transport}, BaseURL: "http://" + o.Addr, APIKey: o.APIKey}, nil
}

// close closes the gRPC connection and the HTTP transport's idle
// connections; later calls of openShell and openSandbox fail.
func (g *gatewayClients) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if g.conn != nil {
		g.conn.Close()
	}
	if g.transport != nil {
		g.transport.CloseIdleConnections()
	}
}

// inventorySource is one gateway an inventory lists.
type inventorySource struct {
	target, provider, addr string
	list                   func(context.Context) ([]protocol.Sandbox, error)
}

// inventoryResult is what listing one source gave.
type inventoryResult struct {
	sandboxes []protocol.Sandbox
	err       error
}

// sources returns the configured gateways, OpenShell first, with their
// clients. A client that cannot be created lists as that error.
func (g *gatewayClients) sources() []inventorySource {
	var out []inventorySource
	if o := g.cfg.OpenShell; o != nil {
		src := inventorySource{target: protocol.TargetOpenShell, provider: protocol.ProviderOpenShell, addr: o.Addr}
		c, err := g.openShell()
		if err != nil {
			src.list = func(context.Context) ([]protocol.Sandbox, error) { return nil, err }
		} else {
			src.list = c.List
		}
		out = append(out, src)
	}
	if o := g.cfg.OpenSandbox; o != nil {
		src := inventorySource{target: protocol.TargetOpenSandbox, provider: protocol.ProviderOpenSandbox, addr: o.Addr}
		c, err := g.openSandbox()
		if err != nil {
			src.list = func(context.Context) ([]protocol.Sandbox, error) { return nil, err }
		} else {
			src.list = c.List
		}
		out = append(out, src)
	}
	return out
}

// serveInventory serves the inventory stream st (protocol.InventoryParams):
// it lists every configured gateway's sandboxes at once, bounded together
// by Config.InventoryTimeout, then sends each gateway's sandboxes in
// FrameInventory pages (at most 500 sandboxes and under
// protocol.MaxFrameSize each) and ends with one FrameInventoryEnd holding a
// status per gateway. A gateway whose listing failed or timed out is
// reported with Complete false and its error, with whatever sandboxes it
// did return; it does not stop the others. With no gateway configured the
// end frame lists none.
//
// A FrameCancel from the coordinator, the stream's end (the coordinator
// gave up) or the session's end stops the listing, and the stream is
// closed without an end frame. It returns when the answer is written; st is
// closed.
func (a *Agent) serveInventory(ctx context.Context, st *yamux.Stream, h protocol.Header, gw *gatewayClients) {
	defer st.Close()
	defer a.guard.Recover("inventory stream", a.answerPanic(st, nil))
	log := a.log.With("stream", st.StreamID())
	var p protocol.InventoryParams
	if err := h.DecodeParams(&p); err != nil {
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopWatch := a.watchCancel(st, cancel, log)
	defer stopWatch()

	start := time.Now()
	sources := gw.sources()
	results := make([]inventoryResult, len(sources))
	lctx, lcancel := context.WithTimeout(ctx, a.cfg.InventoryTimeout)
	var wg sync.WaitGroup
	for i, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer a.guard.Recover("inventory lister", func(e *panics.Error) { results[i] = inventoryResult{nil, e} })
			sbs, err := src.list(lctx)
			results[i] = inventoryResult{sbs, err}
		}()
	}
	wg.Wait()
	timedOut := lctx.Err() != nil && ctx.Err() == nil
	lcancel()
	if ctx.Err() != nil {
		log.Info("inventory stopped: the coordinator cancelled or the session ended", "duration", time.Since(start))
		return
	}

	end := protocol.InventoryEnd{Gateways: make([]protocol.GatewayStatus, 0, len(sources))}
	for i, src := range sources {
		r := results[i]
		status := protocol.GatewayStatus{Target: src.target, Provider: src.provider, Complete: r.err == nil}
		var problems []string
		if r.err != nil {
			msg := fmt.Sprintf("target %s at %s: list: %v", src.target, src.addr, r.err)
			if timedOut && errors.Is(r.err, context.DeadlineExceeded) {
				msg = fmt.Sprintf("target %s at %s: listing did not finish within %v: %v", src.target, src.addr, a.cfg.InventoryTimeout, r.err)
			}
			problems = append(problems, msg)
		}
		sent, skipped, err := a.sendInventoryPages(st, src.target, r.sandboxes)
		if err != nil {
			log.Warn("inventory: write page", "target", src.target, "err", err)
			return
		}
		if len(skipped) > 0 {
			status.Complete = false
			problems = append(problems, fmt.Sprintf("target %s: %d sandboxes larger than a frame were not sent (ids %s)",
				src.target, len(skipped), clip(strings.Join(skipped, ", "), 500)))
		}
		status.Count = sent
		status.Error = strings.Join(problems, "; ")
		result := listingComplete
		if !status.Complete {
			result = listingIncomplete
			log.Warn("inventory incomplete", "target", src.target, "sent", sent, "err", status.Error)
		}
		a.m.listings.WithLabelValues(src.provider, result).Inc()
		end.Gateways = append(end.Gateways, status)
	}
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	if err := protocol.WriteJSONFrame(st, protocol.FrameInventoryEnd, &end); err != nil {
		log.Warn("inventory: write end", "err", err)
		return
	}
	log.Debug("inventory sent", "gateways", len(end.Gateways), "duration", time.Since(start))
}

// keepLabels are the label keys a sandbox too large for a frame keeps
// first when its labels are cut (protocol.BoundLabels): NeMo Gym's marker
// and its attribution keys, prefixed and bare, which the ledger reads.
var keepLabels = func() []string {
	keys := []string{"nemo-gym.sandbox"}
	for _, n := range []string{"run", "run-id", "team", "user", "workload"} {
		keys = append(keys, "nemo-gym.nvidia.com/"+n, n)
	}
	return keys
}()

// sendInventoryPages writes sbs as FrameInventory pages of target, each at
// most inventoryPageMax sandboxes and inventoryPageBytes of encoded
// sandboxes. A sandbox larger than a page by itself is sent with its labels
// cut (protocol.BoundLabels keeping keepLabels first) and LabelsTruncated
// set. It returns how many were sent and the ids of those skipped for being
// larger than a page even so; an error is a failed write.
func (a *Agent) sendInventoryPages(st *yamux.Stream, target string, sbs []protocol.Sandbox) (sent int, skipped []string, err error) {
	flush := func(page []protocol.Sandbox) error {
		if len(page) == 0 {
			return nil
		}
		st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteJSONFrame(st, protocol.FrameInventory, &protocol.InventoryPage{Target: target, Sandboxes: page}); err != nil {
			return err
		}
		sent += len(page)
		return nil
	}
	budget := inventoryPageBytes - len(target)
	var page []protocol.Sandbox
	size := 0
	for _, sb := range sbs {
		b, err := protocol.MarshalJSON(&sb)
		if err == nil && len(b)+1 > budget {
			sb.Labels, _ = protocol.BoundLabels(sb.Labels, keepLabels)
			sb.LabelsTruncated = true
			b, err = protocol.MarshalJSON(&sb)
		}
		if err != nil || len(b)+1 > budget {
			skipped = append(skipped, sb.ID)
			continue
		}
		if len(page) == inventoryPageMax || size+len(b)+1 > budget {
			if err := flush(page); err != nil {
				return sent, skipped, err
			}
			page, size = nil, 0
		}
		page = append(page, sb)
		size += len(b) + 1 // and a comma
	}
	return sent, skipped, flush(page)
}

// watchCancel reads what the coordinator sends on st, in a goroutine, and
// calls cancel on FrameCancel, at the stream's end (the coordinator closed
// it: it gave up) or on a read error. Other frames are ignored. The
// returned stop ends the goroutine and waits for it.
func (a *Agent) watchCancel(st *yamux.Stream, cancel context.CancelFunc, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		defer a.guard.Recover("cancel watcher", nil)
		fr := protocol.NewFrameReader(st)
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			if f.Type == protocol.FrameCancel {
				log.Info("cancelled by the coordinator")
				return
			}
			log.Warn("ignoring unexpected frame from the coordinator", "frame", f.Type)
		}
	}()
	return func() {
		st.SetReadDeadline(time.Now())
		<-done
	}
}
