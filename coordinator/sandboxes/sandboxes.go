// Package sandboxes runs the coordinator's sandbox services around one
// Coordinator: the ledger (coordinator/ledger) and its NATS endpoints, the
// inventory loop that keeps it in step with every node's gateways, the
// reaper, and the OpenShell and OpenSandbox facades. It is the wiring the
// `tether coordinator` command and the in-process test fleets share; each
// part lives in its own package.
//
// Use: Open (the ledger, so its endpoints can be given to the coordinator's
// micro service through coordinator.Config.Endpoints), coordinator.New,
// Attach (reaper and facades), then Run next to Coordinator.Serve.
package sandboxes

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Config configures the sandbox services. NATS is required; everything
// else has a default.
type Config struct {
	// NATS is the coordinator's connection; its server must have
	// JetStream (the ledger's KV buckets). The caller owns it.
	NATS *nats.Conn
	// ID names the coordinator in events and in the reaper's lock.
	ID string
	// Ledger adjusts the ledger's configuration (attribution keys,
	// retention...); NATS, ID, Logger and Registerer are set by Open.
	Ledger ledger.Config
	// Reaper adjusts the reaper; Deleter and Fleet are set by Attach.
	// NoReaper turns it off (records are still kept).
	Reaper   ledger.ReaperConfig
	NoReaper bool
	// InventoryInterval is how often every node's gateways are listed;
	// zero means coordinator.DefaultInventoryInterval (30 s).
	InventoryInterval time.Duration
	// OpenShell, if set, serves the OpenShell gRPC facade on it, with TLS
	// when OpenShellTLS is set.
	OpenShell    net.Listener
	OpenShellTLS *tls.Config
	// OpenSandbox, if set, serves the OpenSandbox HTTP facade on it, with
	// TLS when OpenSandboxTLS is set.
	OpenSandbox    net.Listener
	OpenSandboxTLS *tls.Config
	// ExternalHost is the host[:port] OpenSandbox callers reach the facade
	// at, written into rewritten endpoints; empty: the request's Host. Its
	// host is one of the OpenSandbox facade's allowed names.
	ExternalHost string
	// AllowedHosts are names (host names, IP addresses, *.domain) the
	// facades answer to besides loopback ones and their listen addresses
	// (Host header, :authority, Origin; see coordinator/facade/hostcheck).
	// A facade on loopback answers to nothing else; one on another
	// address answers to any name unless this is set.
	AllowedHosts []string
	// AllowedHostsHint ends the facades' refusals of a foreign name, e.g.
	// "add it to --facade-allowed-hosts".
	AllowedHostsHint string
	// CheckToken, when set, makes both facades an authentication boundary
	// (a tether-token, or a verified client certificate). Nil: no check —
	// only for facades bound to loopback.
	CheckToken func(token string) bool
	// TokenName names the facade caller a token CheckToken accepted
	// belongs to (policy identity token:NAME); nil names every token
	// "facade".
	TokenName func(token string) string
	// Local names the caller of a facade call that carries no
	// credentials on facades without an authentication boundary
	// (CheckToken nil: loopback) by the uid owning its socket
	// (coordinator/facade/peeruid), e.g. peeruid.Identity, or the dev
	// user's identity for the dev process's uid; nil, a zero Identity or
	// an unknown uid leave the caller unidentified.
	Local func(uid uint32) policy.Identity
	// DefaultTTL is the Tether TTL of OpenShell sandboxes created through
	// the facade without a tether-ttl; zero means none.
	DefaultTTL time.Duration
	// Logger and Registerer receive every part's logs and metrics.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Service is the running sandbox services.
type Service struct {
	cfg    Config
	log    *slog.Logger
	guard  *panics.Guard // contains a panic of one sync request
	ledger *ledger.Ledger
	coord  *coordinator.Coordinator
	reaper *ledger.Reaper
	osh    *openshell.Server
	osb    *opensandbox.Facade
	osbSrv *http.Server
	// oshHosts and osbHosts are the facades' name policies (logged).
	oshHosts, osbHosts *hostcheck.Policy
}

// Open opens the ledger and waits until it has loaded (bounded by ctx).
func Open(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.NATS == nil {
		return nil, errors.New("sandboxes: Config.NATS is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	lc := cfg.Ledger
	lc.NATS, lc.ID, lc.Logger, lc.Registerer = cfg.NATS, cfg.ID, cfg.Logger, cfg.Registerer
	l, err := ledger.Open(ctx, lc)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: %w", err)
	}
	if err := l.WaitReady(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("sandboxes: ledger load: %w", err)
	}
	return &Service{cfg: cfg, log: cfg.Logger, ledger: l, guard: panics.New(cfg.Registerer, cfg.Logger, "coordinator")}, nil
}

// Ledger returns the ledger.
func (s *Service) Ledger() *ledger.Ledger { return s.ledger }

// Reaper returns the reaper, nil before Attach or with NoReaper.
func (s *Service) Reaper() *ledger.Reaper { return s.reaper }

// Endpoints adds the ledger's lease and sandbox endpoints to the
// coordinator's micro service; give it to coordinator.Config.Endpoints. It
// runs when Serve starts the service, after Attach.
func (s *Service) Endpoints(svc micro.Service) error {
	// Registrations name a node this coordinator has seen: a typo would
	// otherwise hold a live record for a node that never comes.
	known := ledger.WithKnownNode(func(n string) bool { _, ok := s.coord.ConnectedSince(n); return ok })
	labels := ledger.WithNodeLabels(func(n string) map[string]string { l, _ := s.coord.NodeLabels(n); return l })
	if err := s.ledger.AddEndpoints(svc, s.reaper, known, labels, ledger.WithAuthorizer(s.coord.Authorizer())); err != nil {
		return err
	}
	if err := svc.AddEndpoint("sandboxes-sync", micro.HandlerFunc(s.handleSync), micro.WithEndpointSubject(protocol.SubjectSandboxesSync)); err != nil {
		return fmt.Errorf("sandboxes: add endpoint sandboxes-sync on %s: %w", protocol.SubjectSandboxesSync, err)
	}
	return nil
}

// syncTimeout bounds one SubjectSandboxesSync request.
const syncTimeout = 2 * time.Minute

// handleSync takes every node's inventory now. micro serves an endpoint's
// requests one at a time, so the wait runs on its own goroutine.
func (s *Service) handleSync(req micro.Request) {
	// A sync makes every node list its gateways: administration.
	if _, e := s.coord.Authorizer().Authorize(req, policy.OpAdmin, nil, policy.Object{}); e != nil {
		body, _ := json.Marshal(e)
		req.Error(strconv.Itoa(e.Status), e.Message, body)
		return
	}
	go func() {
		defer s.guard.Recover("nats sandboxes-sync", func(e *panics.Error) {
			ae := protocol.NewAPIError(500, protocol.ErrCodeInternal, "%v", e)
			body, _ := json.Marshal(ae)
			req.Error(strconv.Itoa(ae.Status), ae.Message, body)
		})
		ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
		defer cancel()
		start := time.Now()
		problems, err := s.coord.Sync(ctx)
		if err != nil {
			e := protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "%v", err)
			body, _ := json.Marshal(e)
			req.Error(strconv.Itoa(e.Status), e.Message, body)
			return
		}
		// Nodes that hold records but are not connected were not listed
		// either: say so, or a sync would look complete.
		seen := map[string]bool{}
		for _, st := range []ledger.State{ledger.StateLive, ledger.StateDeleting} {
			for _, r := range s.ledger.List(ledger.Filter{State: string(st)}) {
				if _, ok := s.coord.ConnectedSince(r.Node); !ok && !seen[r.Node] {
					seen[r.Node] = true
					problems = append(problems, protocol.SyncProblem{Node: r.Node, Error: "not connected: its records are as last seen"})
				}
			}
		}
		req.RespondJSON(protocol.SandboxesSyncResponse{DurationMS: time.Since(start).Milliseconds(), Incomplete: problems})
	}()
}

// Attach builds the reaper and the facades on c. Call it before
// c.Serve, then Run.
func (s *Service) Attach(c *coordinator.Coordinator) error {
	s.coord = c
	if !s.cfg.NoReaper {
		rc := s.cfg.Reaper
		rc.Deleter = deleter{c}
		rc.Fleet = c
		if rc.Logger == nil {
			rc.Logger = s.log
		}
		r, err := ledger.NewReaper(s.ledger, rc)
		if err != nil {
			return fmt.Errorf("sandboxes: %w", err)
		}
		s.reaper = r
	}
	// The facades record their calls in the coordinator's audit log; a
	// nil recorder must stay a nil interface.
	var oshAudit openshell.Auditor
	var osbAudit opensandbox.Auditor
	if rec := c.AuditLog(); rec != nil {
		oshAudit, osbAudit = rec, rec
	}
	if s.cfg.OpenShell != nil {
		hosts, err := s.hostPolicy(s.cfg.OpenShell, "")
		if err != nil {
			return err
		}
		srv, err := openshell.New(openshell.Config{
			Fleet: fleetView{c}, Ledger: s.ledger, Logger: s.log, Registerer: s.cfg.Registerer,
			DefaultTTL: s.cfg.DefaultTTL, CheckToken: s.cfg.CheckToken, TLS: s.cfg.OpenShellTLS,
			Hosts: hosts, TokenName: s.cfg.TokenName, Local: s.cfg.Local, Authorizer: c.Authorizer(),
			Audit: oshAudit,
		})
		s.oshHosts = hosts
		if err != nil {
			return fmt.Errorf("sandboxes: %w", err)
		}
		s.osh = srv
	}
	if s.cfg.OpenSandbox != nil {
		hosts, err := s.hostPolicy(s.cfg.OpenSandbox, s.cfg.ExternalHost)
		if err != nil {
			return err
		}
		f, err := opensandbox.New(opensandbox.Config{
			Fleet: fleetView{c}, Ledger: s.ledger, Logger: s.log, Registerer: s.cfg.Registerer,
			ExternalHost: s.cfg.ExternalHost, CheckToken: s.cfg.CheckToken, Hosts: hosts,
			TokenName: s.cfg.TokenName, Local: s.cfg.Local, Authorizer: c.Authorizer(),
			Audit: osbAudit,
		})
		if err != nil {
			return fmt.Errorf("sandboxes: %w", err)
		}
		s.osb, s.osbHosts = f, hosts
		s.osbSrv = f.HTTPServer(s.cfg.OpenSandboxTLS)
	}
	return nil
}

// fleetView is the coordinator as the facades see it: every node of the
// fleet (coordinator.FleetNodes: the ones other coordinators hold too,
// dialled through their owners by DialTarget), so that a facade on any
// coordinator places, lists and reaches sandboxes on every node.
type fleetView struct{ *coordinator.Coordinator }

func (f fleetView) Nodes(sel protocol.Selector) []protocol.NodeInfo { return f.FleetNodes(sel) }

// hostPolicy is the name policy of a facade listening on ln: loopback
// names, ln's address, Config.AllowedHosts and external (a host[:port],
// or "").
func (s *Service) hostPolicy(ln net.Listener, external string) (*hostcheck.Policy, error) {
	allowed := slices.Clone(s.cfg.AllowedHosts)
	// A malformed external host is opensandbox.Config.Validate's to report.
	if external != "" && !strings.ContainsAny(external, "/@ ") {
		h := external
		if host, _, err := net.SplitHostPort(external); err == nil {
			h = host
		}
		allowed = append(allowed, h)
	}
	p, err := hostcheck.New(hostcheck.Config{Listen: ln.Addr().String(), Allowed: allowed, Hint: s.cfg.AllowedHostsHint})
	if err != nil {
		return nil, fmt.Errorf("sandboxes: facade on %s: %w", ln.Addr(), err)
	}
	return p, nil
}

// Run runs the inventory loop, the reaper and the facades until ctx ends,
// then stops them and closes the ledger. It returns the first failure of a
// facade listener, or nil.
func (s *Service) Run(ctx context.Context) error {
	if s.coord == nil {
		return errors.New("sandboxes: Run before Attach")
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				s.log.Error(name+" stopped", "err", err)
				cancel(fmt.Errorf("%s: %w", name, err))
			}
		}()
	}
	goRun("sandbox inventory", func() error { s.coord.RunInventory(ctx, s.ledger, s.cfg.InventoryInterval); return nil })
	if s.reaper != nil {
		goRun("reaper", func() error { return s.reaper.Run(ctx) })
	}
	if s.osh != nil {
		s.log.Info("openshell facade listening", "addr", s.cfg.OpenShell.Addr().String(), "tls", s.cfg.OpenShellTLS != nil, "names", s.oshHosts.String())
		goRun("openshell facade", func() error { return s.osh.Serve(s.cfg.OpenShell) })
	}
	if s.osbSrv != nil {
		s.log.Info("opensandbox facade listening", "addr", s.cfg.OpenSandbox.Addr().String(), "tls", s.cfg.OpenSandboxTLS != nil, "names", s.osbHosts.String())
		goRun("opensandbox facade", func() error {
			var err error
			if s.cfg.OpenSandboxTLS != nil {
				err = s.osbSrv.ServeTLS(s.cfg.OpenSandbox, "", "")
			} else {
				err = s.osbSrv.Serve(s.cfg.OpenSandbox)
			}
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return err
		})
	}
	<-ctx.Done()
	if s.osh != nil {
		s.osh.Stop()
	}
	if s.osbSrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.osbSrv.Shutdown(sctx)
		scancel()
		s.osbSrv.Close()
		s.osb.Close()
	}
	wg.Wait()
	s.ledger.Close()
	if parent.Err() != nil {
		return nil
	}
	return context.Cause(ctx)
}

// deleter deletes through the coordinator (the agent runs the delete with
// its own gateway credentials).
type deleter struct{ c *coordinator.Coordinator }

func (d deleter) Delete(ctx context.Context, r ledger.Record) error { return d.c.DeleteSandbox(ctx, r) }
