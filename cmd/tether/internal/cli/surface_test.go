package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
	"github.com/tetherfleet/tether/tunnel"
)

var updateSurface = flag.Bool("update", false, "TestSurface: rewrite testdata/surface.golden with what the listeners answer (review the diff before committing it)")

// surfaceGolden is the reviewed allow-list of TestSurface.
const surfaceGolden = "testdata/surface.golden"

// surfaceHeader heads surfaceGolden.
const surfaceHeader = `# Tether's attack surface: what every listener of a coordinator answers to
# each kind of caller. Written by TestSurface (cmd/tether/internal/cli/
# surface_test.go), which starts a whole coordinator as "tether coordinator"
# does (every listener on, one enrolled agent, a policy with roles admin,
# submitter and reader) and probes it with no credentials, with each role's
# credentials, with credentials policy does not know (stranger), and on
# NATS as a reader limited to one request (limited).
#
# THIS FILE IS A SECURITY ALLOW-LIST. A change to it is a change to who may
# do what: review every changed cell before committing it. TestSurface fails
# when what answers differs from this file, and when a handler, subject,
# route, method, stream or bucket exists in the code without a probe here.
# Regenerate after a reviewed change with
#
#	go test ./cmd/tether/internal/cli -run TestSurface -update
#
# Outcomes:
#   refused-at-connect    the connection or handshake was refused
#   permission-violation  the NATS server refused the publish or subscribe
#   no-responders         published, but nothing in the coordinators' account
#                         listens (the subject stays in CLIENTS)
#   dropped               publish allowed, but it never reached the
#                         coordinators' account (checked by a TETHER spy)
#   reached-tether        the message reached the coordinators' account
#                         (heartbeats and pipe data: the coordinator drops
#                         what does not come from the job's or pipe's owner)
#   401 403 429           refused: unauthenticated, forbidden, rate limited
#   unknown               no such route, method or service
#   ok                    answered, and not with 401, 403 or 429; ":X" is
#                         the answer's status when it is not a success
#                         (ok:404: no such job or sandbox, ok:InvalidArgument:
#                         the gateway refused the empty request)
#   refused:CODE          the tunnel refused the handshake with CODE
#   closed:CODE           the WebSocket was closed with status CODE (1003:
#                         binary messages only)
#   -                     not probed (that caller cannot speak there)
#
# The admin HTTP server's /metrics, /healthz and /readyz take no credentials
# at all (keep it on loopback or behind a proxy); its web console under
# /console/ takes a console token (Authorization: Bearer, or the login
# cookie) or names a loopback caller by its uid (here "none": the test's
# uid, which policy does not name). 404s of /console/jobs/... are the
# console's own (no such job, or not one the caller may see): ok:404.
`

// Fixed names, so the golden file does not depend on the host.
const (
	surfaceCoordinator = "surface"
	surfaceNode        = "surface-node"
	surfaceProbeNode   = "surface-probe"
)

// surfaceRoles are the policy's roles; each is a NATS user and a facade
// token of the same name. "stranger" is known to the NATS layout and the
// token file, not to policy.
var surfaceRoles = []string{"admin", "submitter", "reader", "stranger"}

func surfacePolicy(runAs string) string {
	return `version: 1
roles:
  admin:
    - nodes: "*"
      operations: [exec, shell, cp.read, cp.write]
      paths: [/]
      run_as: ` + runAs + `
    - nodes: "*"
      operations: [forward]
      targets: [openshell, opensandbox]
    - nodes: "*"
      operations: [job.status, job.logs, job.cancel, sandboxes.register]
      scope: any
    - nodes: "*"
      operations: [nodes.list]
    - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
      scope: any
    - operations: [admin]
  submitter:
    - nodes: "pool=surface"
      operations: [exec, job.status, job.logs, job.cancel]
      run_as: ` + runAs + `
    - nodes: "pool=surface"
      operations: [nodes.list, sandboxes.register]
    - nodes: "pool=surface"
      operations: [forward]
      targets: [opensandbox]
    - operations: [sandboxes.lease, sandboxes.list]
  reader:
    - nodes: "*"
      operations: [nodes.list, job.status, job.logs]
      scope: any
    - operations: [sandboxes.list]
      scope: any
identities:
  nats:admin: {roles: [admin]}
  nats:submitter: {roles: [submitter]}
  nats:reader: {roles: [reader]}
  token:admin: {roles: [admin]}
  token:submitter: {roles: [submitter]}
  token:reader: {roles: [reader]}
  cert:submitter: {roles: [submitter]}
  nats:limited:
    roles: [reader]
    limits: {requests_per_second: 0.001, burst: 1}
`
}

// surfaceRow is one observation: what listener answered to caller at entry.
type surfaceRow struct{ listener, entry, caller, outcome string }

// surfaceTable collects the observations.
type surfaceTable struct{ rows []surfaceRow }

func (s *surfaceTable) add(listener, entry, caller, outcome string) {
	s.rows = append(s.rows, surfaceRow{listener, entry, caller, outcome})
}

// Listener sections of the golden file, in order.
const (
	lnTunnel      = "tunnel"
	lnAdmin       = "admin-http"
	lnOpenShell   = "openshell-grpc"
	lnOpenSandbox = "opensandbox-http"
	lnNATS        = "nats"
)

// render writes the table as one grid per listener: a row per entry (in
// the order entries lists them), a column per caller (in callers' order).
func (s *surfaceTable) render(entries, callers map[string][]string) string {
	var b bytes.Buffer
	b.WriteString(surfaceHeader)
	cells := map[[3]string]string{}
	for _, r := range s.rows {
		cells[[3]string{r.listener, r.entry, r.caller}] = r.outcome
	}
	for _, ln := range []string{lnTunnel, lnAdmin, lnOpenShell, lnOpenSandbox, lnNATS} {
		fmt.Fprintf(&b, "\n## %s\n", ln)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "entry\t%s\n", strings.Join(callers[ln], "\t"))
		for _, e := range entries[ln] {
			row := []string{e}
			for _, c := range callers[ln] {
				o, ok := cells[[3]string{ln, e, c}]
				if !ok {
					o = "-"
				}
				row = append(row, o)
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		tw.Flush()
	}
	// tabwriter pads the last column too; trailing spaces only make
	// editors and diffs noisy.
	lines := strings.Split(b.String(), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	return strings.Join(lines, "\n")
}

// TestSurface walks every listener of a whole coordinator (the agent
// tunnel, the admin HTTP server, the OpenShell gRPC facade, the
// OpenSandbox HTTP facade, NATS with every subject the coordinator serves
// or uses) with no credentials and with each role's, and compares what
// answers with the reviewed allow-list testdata/surface.golden. It also
// fails when the code has a handler, subject, route, method, stream or
// bucket that no probe covers, so that nothing new escapes the list.
func TestSurface(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole coordinator")
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o := testCoordinatorOptions(t, filepath.Join(dir, "coord"))
	o.ID = surfaceCoordinator
	o.Policy = writeTestPolicy(t, surfacePolicy(me.Username))
	o.Sandbox.DryRun = true // the reaper deletes nothing behind the probes' backs
	// The facades as an authentication boundary: TLS, named tokens.
	pki, err := tunnel.EnsureDevPKI(filepath.Join(dir, "facade-pki"), []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	o.Sandbox.TLSCert, o.Sandbox.TLSKey = pki.ServerCert, pki.ServerKey
	tokens := map[string]string{}
	var tokFile strings.Builder
	for _, r := range surfaceRoles {
		tokens[r] = "surface-token-" + r + "-0123456789abcdef"
		fmt.Fprintf(&tokFile, "%s %s\n", r, tokens[r])
	}
	// Client certificates: one from the facades' client CA, one from a CA
	// they do not know.
	clientCA, err := tunnel.NewTestCA("surface facade clients")
	if err != nil {
		t.Fatal(err)
	}
	foreignCA, err := tunnel.NewTestCA("surface foreign")
	if err != nil {
		t.Fatal(err)
	}
	o.Sandbox.ClientCA = filepath.Join(dir, "facade-client-ca.pem")
	if err := os.WriteFile(o.Sandbox.ClientCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientCA.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	fc := facadeCreds{tokens: tokens, certs: map[string]tls.Certificate{
		"cert:submitter":  clientCert(t, clientCA, "submitter"),
		"cert:foreign-ca": clientCert(t, foreignCA, "admin"),
	}}
	o.Sandbox.TokenFile = filepath.Join(dir, "facade-tokens")
	if err := os.WriteFile(o.Sandbox.TokenFile, []byte(tokFile.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Console.TokenFile = o.Sandbox.TokenFile // the console's callers are the facades'
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cs, err := startCoordinator(o, "", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	serveCoordinator(t, cs)

	// The coordinators' eye: coordinator credentials, never a caller.
	eyeCreds, err := cs.layout.MintCoordinator("surface-eye")
	if err != nil {
		t.Fatal(err)
	}
	eye, err := nats.Connect(cs.info.NATSURL, nats.UserJWTAndSeed(eyeCreds.JWT, string(eyeCreds.Seed)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eye.Close)

	// One agent, enrolled with a join token.
	tctx, tcancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer tcancel()
	joinTok, _, err := cs.ids.CreateToken(tctx, 10*time.Minute, 1, map[string]string{"pool": "surface"}, "surface-test")
	if err != nil {
		t.Fatal(err)
	}
	agentDir := t.TempDir()
	startSurfaceAgent(t, cs, joinTok, agentDir, log)
	adminCreds := mintSurfaceCreds(t, cs, "admin")
	waitFor(t, func() error {
		nc := connectCreds(t, cs, adminCreds)
		defer nc.Close()
		ns, err := client.New(nc).Nodes(tctx, "")
		if err != nil || len(ns) != 1 {
			return fmt.Errorf("agent not registered yet: %v %v", ns, err)
		}
		return nil
	})

	tab := &surfaceTable{}
	entries := map[string][]string{}
	callers := map[string][]string{}

	entries[lnNATS], callers[lnNATS] = probeNATS(t, cs, eye, tab)
	entries[lnAdmin], callers[lnAdmin] = probeAdmin(t, cs, fc, tab)
	entries[lnOpenSandbox], callers[lnOpenSandbox] = probeOpenSandbox(t, cs, pki.CACert, fc, tab)
	entries[lnOpenShell], callers[lnOpenShell] = probeOpenShell(t, cs, pki.CACert, fc, tab)
	entries[lnTunnel], callers[lnTunnel] = probeTunnel(t, cs, agentDir, tab)

	got := tab.render(entries, callers)
	if *updateSurface {
		if err := os.WriteFile(surfaceGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: review its diff before committing it", surfaceGolden)
		return
	}
	want, err := os.ReadFile(surfaceGolden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it, then review it)", err)
	}
	if got != string(want) {
		t.Errorf("the surface differs from %s (- reviewed, + observed); if the change is intended, run with -update and have the diff reviewed:\n%s",
			surfaceGolden, lineDiff(string(want), got))
	}
}

// startSurfaceAgent runs one agent, as tether agent does, until the test
// ends.
func startSurfaceAgent(t *testing.T, cs *coordinatorServer, joinToken, dir string, log *slog.Logger) {
	t.Helper()
	acfg := testAgentConfig(t, cs, surfaceNode, joinToken, log)
	acfg.Labels = map[string]string{"pool": "surface"}
	acfg.DataDir = dir
	// Both gateways, so that facade calls reach a node and what answers
	// is the facade's authorization, not "no gateway".
	gw := openshelltest.New(openshelltest.Options{})
	gwAddr, err := gw.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	osbSrv := opensandboxtest.NewServer(opensandboxtest.Config{Logger: log})
	t.Cleanup(func() { osbSrv.Close() })
	acfg.OpenShell = &agent.OpenShellTarget{Addr: gwAddr}
	acfg.OpenSandbox = &agent.OpenSandboxTarget{Addr: osbSrv.Host()}
	runTestAgent(t, acfg)
}

func mintSurfaceCreds(t *testing.T, cs *coordinatorServer, name string) *natsauth.Creds {
	t.Helper()
	c, err := cs.layout.MintClient(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func connectCreds(t *testing.T, cs *coordinatorServer, c *natsauth.Creds) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(cs.info.NATSURL, c.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// lineDiff lists the lines of want missing from got (-) and those of got
// missing from want (+), in order: enough to read a changed cell.
func lineDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	count := func(ls []string) map[string]int {
		m := map[string]int{}
		for _, l := range ls {
			m[l]++
		}
		return m
	}
	wc, gc := count(wl), count(gl)
	var b strings.Builder
	for _, l := range wl {
		if gc[l] > 0 {
			gc[l]--
			continue
		}
		b.WriteString("- " + l + "\n")
	}
	gc = count(gl)
	for _, l := range gl {
		if wc[l] > 0 {
			wc[l]--
			continue
		}
		b.WriteString("+ " + l + "\n")
	}
	return b.String()
}

// ---- NATS ----

// natsProbe is one thing a caller tries on NATS.
type natsProbe struct {
	entry string
	// run performs the probe on a fresh connection of the caller and
	// returns its outcome.
	run func(nc *nats.Conn, self *surfaceCaller) string
}

// surfaceCaller is one NATS caller: a role's user, or anonymous (creds
// nil).
type surfaceCaller struct {
	name  string
	creds *natsauth.Creds
	other *natsauth.Creds // another user, whose inbox this one must not read
}

// runID is the run the caller's lease and sandbox requests name: its own,
// so that no caller's outcome depends on another's.
func (c *surfaceCaller) runID() string {
	if c.creds == nil {
		return "anonymous"
	}
	return "surface-" + c.creds.Name()
}

// natsRequestSamples are the requests the probes send to each endpoint of
// the micro service, by subject: valid requests, so that what answers is
// authentication and authorization, not validation. self names the
// caller's run. A new endpoint needs a sample here (TestSurface fails
// without one).
func natsRequestSamples(self string) map[string]any {
	return map[string]any{
		protocol.SubjectExec:              protocol.ExecRequest{Target: protocol.Target{Node: surfaceNode}, Argv: []string{"true"}},
		protocol.SubjectExecOnce:          protocol.ExecRequest{Target: protocol.Target{Node: surfaceNode}, Argv: []string{"true"}},
		protocol.SubjectNodes:             protocol.NodesRequest{},
		protocol.SubjectCancel:            protocol.CancelRequest{ID: "surface-no-such-job"},
		protocol.SubjectJobStatus:         protocol.JobRequest{Node: surfaceNode, ID: "surface-no-such-job"},
		protocol.SubjectJobOutput:         protocol.JobOutputRequest{Node: surfaceNode, ID: "surface-no-such-job", Stream: "stdout"},
		protocol.SubjectJobCancel:         protocol.JobRequest{Node: surfaceNode, ID: "surface-no-such-job"},
		protocol.SubjectJobGet:            protocol.JobGetRequest{ID: "surface-no-such-job"},
		protocol.SubjectJobList:           protocol.JobListRequest{},
		protocol.SubjectAuditQuery:        protocol.AuditQueryRequest{},
		protocol.SubjectTokensCreate:      protocol.TokenCreateRequest{TTLSeconds: 60},
		protocol.SubjectNodesRevoke:       protocol.NodeRevokeRequest{Node: "surface-never-enrolled"},
		protocol.SubjectLeaseOpen:         protocol.LeaseOpenRequest{Run: self},
		protocol.SubjectLeaseRenew:        protocol.LeaseRequest{Run: self},
		protocol.SubjectSandboxesRegister: protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenSandbox, Node: surfaceNode, ID: self, Run: self},
		protocol.SubjectSandboxesList:     protocol.SandboxesListRequest{},
		protocol.SubjectSandboxesReap:     protocol.ReapRequest{Run: self, DryRun: true},
		protocol.SubjectSandboxesSync:     struct{}{},
		protocol.SubjectLeaseClose:        protocol.LeaseRequest{Run: self},
		protocol.SubjectSSHInfo:           protocol.SSHInfoRequest{},
	}
}

// streamSamples are the params the probes open each stream kind with
// through tether.v1.stream (clients may open only some kinds; the others
// are probed too).
var streamSamples = map[protocol.Kind][]struct {
	label  string
	params any
}{
	protocol.KindControl:   {{"", protocol.ControlParams{}}},
	protocol.KindExec:      {{"", protocol.ExecParams{Argv: []string{"true"}}}},
	protocol.KindCopy:      {{"pull /etc/hostname", protocol.CopyParams{Direction: protocol.CopyPull, Path: "/etc/hostname"}}},
	protocol.KindPTY:       {{"", protocol.PTYParams{Argv: []string{"true"}}}},
	protocol.KindSSH:       {{"", struct{}{}}},
	protocol.KindDial:      {{protocol.TargetOpenShell, protocol.DialParams{Target: protocol.TargetOpenShell}}, {protocol.TargetOpenSandbox, protocol.DialParams{Target: protocol.TargetOpenSandbox}}},
	protocol.KindJob:       {{"", protocol.JobParams{}}},
	protocol.KindInventory: {{"", protocol.InventoryParams{}}},
	protocol.KindSandbox:   {{"", protocol.SandboxOpParams{}}},
}

// streamProbe opens a stream of kind k to the agent through
// tether.v1.stream, as the client does, and classifies the answer.
func streamProbe(nc *nats.Conn, k protocol.Kind, params any) string {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := client.New(nc).OpenStream(ctx, surfaceNode, k, params)
	if err != nil {
		var ae *protocol.APIError
		if errors.As(err, &ae) {
			return statusOutcome(ae.Status)
		}
		return "error: " + err.Error()
	}
	st.Close()
	return "ok"
}

// natsPublishOnly are the endpoints that never answer (heartbeats): the
// probe publishes and records whether it reached TETHER.
var natsPublishOnly = map[string]bool{protocol.SubjectExecAlive: true}

// surfacePipe is a pipe subject of the coordinator, for a pipe nobody
// opened: clients may publish there (the coordinator drops what does not
// come from a pipe's opener).
const surfacePipe = natsauth.PipeSubjectPrefix + surfaceCoordinator + ".SURFACEPROBEPIPE"

// natsOrder is the order requests go in (leases before what uses them,
// close last); endpoints not named come after, sorted.
var natsOrder = []string{
	protocol.SubjectNodes, protocol.SubjectExec, protocol.SubjectExecOnce, protocol.SubjectExecAlive, protocol.SubjectStream,
	protocol.SubjectCancel, protocol.SubjectJobStatus, protocol.SubjectJobOutput, protocol.SubjectJobCancel,
	protocol.SubjectJobGet, protocol.SubjectJobList, protocol.SubjectLeaseOpen, protocol.SubjectLeaseRenew, protocol.SubjectSandboxesRegister,
	protocol.SubjectSandboxesList, protocol.SubjectSandboxesReap, protocol.SubjectLeaseClose,
	protocol.SubjectSandboxesSync, protocol.SubjectAuditQuery, protocol.SubjectTokensCreate, protocol.SubjectNodesRevoke,
}

// tetherSpy subscribes to everything in TETHER and remembers the probe
// markers it sees, to tell what a client's publish reached.
type tetherSpy struct {
	eye  *nats.Conn
	n    atomic.Int64 // numbers the marks
	mu   sync.Mutex
	seen map[string]bool
	cond *sync.Cond
}

const spyHeader = "Surface-Probe"

func newTetherSpy(t *testing.T, eye *nats.Conn) *tetherSpy {
	s := &tetherSpy{eye: eye, seen: map[string]bool{}}
	s.cond = sync.NewCond(&s.mu)
	sub, err := eye.Subscribe(">", func(m *nats.Msg) {
		if v := m.Header.Get(spyHeader); v != "" {
			s.mu.Lock()
			s.seen[v] = true
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := eye.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// reached reports whether the message marked mark, published by a
// connection that was flushed since, reached TETHER: the spy's sentinel,
// published after it, arrives after it would have.
func (s *tetherSpy) reached(t *testing.T, mark string) bool {
	sentinel := "sentinel-" + mark
	if err := s.eye.PublishMsg(&nats.Msg{Subject: "surface.sentinel", Header: nats.Header{spyHeader: []string{sentinel}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(defaultTestTimeout)
	timer := time.AfterFunc(defaultTestTimeout, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.seen[sentinel] {
		if time.Now().After(deadline) {
			t.Errorf("the spy never saw its sentinel for %s", mark)
			return false
		}
		s.cond.Wait()
	}
	return s.seen[mark]
}

// probeNATS probes NATS: connecting, every endpoint of the micro service
// (from $SRV.INFO), joining its queue group, every stream and bucket of
// JetStream, the events, audit and inbox subjects, and what the brief of
// issue 9 names.
func probeNATS(t *testing.T, cs *coordinatorServer, eye *nats.Conn, tab *surfaceTable) (entries, callerNames []string) {
	// What exists, from the running server.
	resp, err := eye.Request("$SRV.INFO."+protocol.ServiceName, nil, defaultTestTimeout)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(resp.Data, &info); err != nil {
		t.Fatal(err)
	}
	endpoints := map[string]micro.EndpointInfo{}
	for _, e := range info.Endpoints {
		endpoints[e.Subject] = e
	}
	served := map[string]bool{}
	for s := range endpoints {
		served[s] = true
	}
	for s := range natsRequestSamples("x") {
		if !served[s] {
			t.Errorf("natsRequestSamples has %s, which the micro service does not serve: drop it", s)
		}
	}
	var subjects []string // in probe order
	for _, s := range natsOrder {
		if served[s] {
			subjects = append(subjects, s)
			delete(served, s)
		}
	}
	var rest []string
	for s := range served {
		rest = append(rest, s)
	}
	slices.Sort(rest)
	subjects = append(subjects, rest...)
	for _, s := range subjects {
		_, sample := natsRequestSamples("x")[s]
		_, pub := natsPublishOnly[s]
		if !sample && !pub && s != protocol.SubjectStream {
			t.Errorf("the micro service serves %s (endpoint %s) but TestSurface has no probe for it: add a request to natsRequestSamples (or natsPublishOnly) and review the new row of %s",
				s, endpoints[s].Name, surfaceGolden)
		}
	}
	// Every subject the code names must be probed: protocol's Subject*
	// constants and natsauth's exports.
	covered := map[string]bool{}
	for _, s := range subjects {
		covered[s] = true
	}
	covered[natsauth.PipeSubjectPrefix+">"] = true
	covered[protocol.SubjectAuditPrefix] = true        // sub/pub probes below
	covered[protocol.SubjectSandboxEventPrefix] = true // sub/pub probes below
	// The coordinators' own routing (coordinator/fleet.go): publish probes below.
	covered[coordinator.NodeSubjectPrefix+surfaceNode+".>"] = true
	covered[coordinator.CoordSubjectPrefix+"surface.*"] = true
	for name, v := range surfaceProtocolSubjects(t) {
		if !covered[v] {
			t.Errorf("protocol.%s = %q is not served by the micro service and has no probe in TestSurface: add one", name, v)
		}
	}
	for _, e := range natsauth.ServiceExports() {
		if !covered[e.Subject] {
			t.Errorf("natsauth exports %s to clients but TestSurface does not probe it: add a probe", e.Subject)
		}
	}
	// Every subject the coordinator listens on, from the server: nothing
	// it subscribes to may escape the probes.
	for _, sub := range coordinatorSubscriptions(t, cs) {
		switch {
		case covered[sub],
			strings.HasPrefix(sub, "$SRV."),                      // micro's discovery: the "$SRV.>" and "$SRV.INFO" probes
			strings.HasPrefix(sub, nats.InboxPrefix),             // the coordinator's own replies: the "_INBOX.>" probe
			strings.HasPrefix(sub, natsauth.PipeSubjectPrefix),   // pipe ends: the pipe publish probe
			strings.HasPrefix(sub, coordinator.RunSubjectPrefix): // a running job's: the run publish probe
		default:
			t.Errorf("the coordinator subscribes to %s, which no probe of TestSurface covers: add one and review the new row of %s", sub, surfaceGolden)
		}
	}
	// JetStream, as the coordinators use it.
	js, err := jetstream.New(eye)
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer lcancel()
	var streams []*jetstream.StreamInfo
	names := js.StreamNames(lctx)
	for n := range names.Name() {
		s, err := js.Stream(lctx, n)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s.CachedInfo())
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(streams, func(a, b *jetstream.StreamInfo) int { return strings.Compare(a.Config.Name, b.Config.Name) })
	if len(streams) < 5 {
		t.Fatalf("only %d JetStream streams: the coordinator did not start them all?", len(streams))
	}

	spy := newTetherSpy(t, eye)
	var probes []natsProbe
	add := func(entry string, run func(*nats.Conn, *surfaceCaller) string) {
		probes = append(probes, natsProbe{entry, run})
	}
	add("connect", func(*nats.Conn, *surfaceCaller) string { return "ok" })
	for _, s := range subjects {
		switch {
		case s == protocol.SubjectStream:
			for _, k := range protocol.Kinds() {
				samples, ok := streamSamples[k]
				if !ok {
					t.Errorf("stream kind %s has no sample in streamSamples: add one (TestSurface opens every kind through %s)", k, s)
				}
				for _, sm := range samples {
					entry := "request " + s + " (" + k.String()
					if sm.label != "" {
						entry += " " + sm.label
					}
					add(entry+")", func(nc *nats.Conn, _ *surfaceCaller) string { return streamProbe(nc, k, sm.params) })
				}
			}
		case natsPublishOnly[s]:
			add("publish "+s, func(nc *nats.Conn, self *surfaceCaller) string {
				return publishProbe(t, nc, spy, s, self.name)
			})
		default:
			add("request "+s, func(nc *nats.Conn, self *surfaceCaller) string {
				return requestProbe(t, nc, s, natsRequestSamples(self.runID())[s])
			})
		}
	}
	add("publish "+surfacePipe, func(nc *nats.Conn, self *surfaceCaller) string {
		return publishProbe(t, nc, spy, surfacePipe, self.name)
	})
	for _, s := range subjects {
		e := endpoints[s]
		add("subscribe "+e.Subject, func(nc *nats.Conn, _ *surfaceCaller) string { return subscribeProbe(nc, e.Subject, "") })
		if e.QueueGroup != "" {
			add("join queue "+e.QueueGroup+" on "+e.Subject, func(nc *nats.Conn, _ *surfaceCaller) string {
				return subscribeProbe(nc, e.Subject, e.QueueGroup)
			})
		}
	}
	for _, pat := range []string{">", "_INBOX.>", "$JS.API.>", "$KV.>", "$SRV.>", "$SYS.>",
		protocol.SubjectSandboxEventPrefix + ">", "tether.v1.events.>", protocol.SubjectAuditPrefix + ">", natsauth.PipeSubjectPrefix + ">", "tether.v1.>"} {
		add("subscribe "+pat, func(nc *nats.Conn, _ *surfaceCaller) string { return subscribeProbe(nc, pat, "") })
	}
	add("subscribe _INBOX_<own key>.>", func(nc *nats.Conn, self *surfaceCaller) string {
		return subscribeProbe(nc, self.creds.InboxPrefix()+".>", "")
	})
	add("subscribe _INBOX_<another user's key>.>", func(nc *nats.Conn, self *surfaceCaller) string {
		return subscribeProbe(nc, self.other.InboxPrefix()+".>", "")
	})
	add("publish _INBOX_<another user's key>.x", func(nc *nats.Conn, self *surfaceCaller) string {
		return publishProbe(t, nc, spy, self.other.InboxPrefix()+".x", self.name)
	})
	for _, subj := range []string{"$JS.API.STREAM.LIST", "$JS.API.INFO", "$KV.tether_locks.x",
		protocol.SubjectSandboxEventPrefix + "surface", protocol.SubjectAuditPrefix + "surface", "tether.v1.node." + surfaceNode + ".exec",
		"tether.v1.run.surface-job.cancel", "tether.v1.coord.surface.nodes"} {
		add("publish "+subj, func(nc *nats.Conn, self *surfaceCaller) string { return publishProbe(t, nc, spy, subj, self.name) })
	}
	add("request $SRV.INFO", func(nc *nats.Conn, _ *surfaceCaller) string { return requestProbe(t, nc, "$SRV.INFO", nil) })
	for _, si := range streams {
		name := si.Config.Name
		add("request $JS.API.STREAM.INFO."+name, func(nc *nats.Conn, _ *surfaceCaller) string {
			return requestProbe(t, nc, "$JS.API.STREAM.INFO."+name, nil)
		})
		for _, subj := range si.Config.Subjects {
			add("subscribe "+subj+" (stream "+name+")", func(nc *nats.Conn, _ *surfaceCaller) string { return subscribeProbe(nc, subj, "") })
			concrete := strings.ReplaceAll(strings.ReplaceAll(subj, ">", "surface"), "*", "surface")
			add("publish "+concrete+" (stream "+name+")", func(nc *nats.Conn, self *surfaceCaller) string {
				out := publishProbe(t, nc, spy, concrete, self.name)
				if out == "dropped" || out == "reached-tether" {
					// A stored message would be a forged record: look.
					gctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
					defer cancel()
					if s, err := js.Stream(gctx, name); err == nil {
						if _, err := s.GetLastMsgForSubject(gctx, concrete); err == nil {
							out += "+stored"
						}
					}
				}
				return out
			})
		}
	}

	// The callers: anonymous, then each role's user.
	roleCreds := map[string]*natsauth.Creds{}
	for _, r := range surfaceRoles {
		roleCreds[r] = mintSurfaceCreds(t, cs, r)
	}
	callerList := []*surfaceCaller{{name: "anonymous"}}
	for i, r := range surfaceRoles {
		other := roleCreds[surfaceRoles[(i+1)%len(surfaceRoles)]]
		callerList = append(callerList, &surfaceCaller{name: "nats:" + r, creds: roleCreds[r], other: other})
	}
	// A reader allowed one request per 1000 s: its first request passes,
	// the rest are rate limited (429), whatever they ask.
	callerList = append(callerList, &surfaceCaller{name: "nats:limited", creds: mintSurfaceCreds(t, cs, "limited"), other: roleCreds["admin"]})
	// One caller after the other, one connection per probe (so that a
	// refusal read from LastError is that probe's): hundreds of
	// connections, each verified by the server, but never many at once,
	// which on a loaded machine could outlast the server's 2 s
	// authentication timeout.
	for _, c := range callerList {
		callerNames = append(callerNames, c.name)
		for _, p := range probes {
			nc, err := connectCaller(t, cs, c)
			switch {
			case errors.Is(err, nats.ErrAuthorization):
				tab.add(lnNATS, p.entry, c.name, "refused-at-connect")
			case err != nil:
				tab.add(lnNATS, p.entry, c.name, "error: "+err.Error())
			default:
				tab.add(lnNATS, p.entry, c.name, p.run(nc, c))
				nc.Close()
			}
		}
	}
	for _, p := range probes {
		entries = append(entries, p.entry)
	}
	return entries, callerNames
}

// connectCaller connects as c. A connection that failed for another reason
// than the server refusing its credentials (a timeout on a loaded machine)
// is tried again: it has no outcome yet.
func connectCaller(t *testing.T, cs *coordinatorServer, c *surfaceCaller) (*nats.Conn, error) {
	var opts []nats.Option
	if c.creds != nil {
		opts = c.creds.Options()
	}
	// Refusals are read from LastError; the default handler would print
	// each one.
	opts = append(opts, nats.NoReconnect(), nats.Timeout(defaultTestTimeout),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var nc *nats.Conn
		if nc, err = nats.Connect(cs.info.NATSURL, opts...); err == nil || errors.Is(err, nats.ErrAuthorization) {
			return nc, err
		}
		t.Logf("connect as %s: %v; trying again", c.name, err)
	}
	return nil, err
}

// coordinatorSubscriptions returns the subjects the coordinator's own NATS
// connections subscribe to, as the embedded server reports them.
func coordinatorSubscriptions(t *testing.T, cs *coordinatorServer) []string {
	cz, err := cs.ns.Connz(&server.ConnzOptions{Subscriptions: true, Account: cs.layout.AccountKey(natsauth.AccountTether), Limit: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cz.Conns {
		if strings.HasPrefix(c.Name, "tether-coordinator ") {
			out = append(out, c.Subs...)
		}
	}
	if len(out) < 10 {
		t.Fatalf("the coordinator's connections hold only %d subscriptions: the server's report changed?", len(out))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// statusOutcome names an API status.
func statusOutcome(code int) string {
	switch code {
	case 0, 200:
		return "ok"
	case 401, 403, 429:
		return strconv.Itoa(code)
	}
	return "ok:" + strconv.Itoa(code)
}

func isPermissionViolation(nc *nats.Conn) bool {
	return errors.Is(nc.LastError(), nats.ErrPermissionViolation)
}

// subscribeProbe subscribes to subject (in queue, if set) and reports
// whether the server allowed it. The server answers a refused SUB before
// the PONG of the flush that follows it.
func subscribeProbe(nc *nats.Conn, subject, queue string) string {
	var err error
	if queue != "" {
		_, err = nc.QueueSubscribeSync(subject, queue)
	} else {
		_, err = nc.SubscribeSync(subject)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	if err := nc.Flush(); err != nil {
		return "error: " + err.Error()
	}
	if isPermissionViolation(nc) {
		return "permission-violation"
	}
	return "ok"
}

// publishProbe publishes to subject, marked, and reports whether the
// server refused it, or else whether it reached TETHER.
func publishProbe(t *testing.T, nc *nats.Conn, spy *tetherSpy, subject, who string) string {
	mark := fmt.Sprintf("%d %s %s", spy.n.Add(1), who, subject)
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header{spyHeader: []string{mark}}, Data: []byte("forged")}); err != nil {
		return "error: " + err.Error()
	}
	if err := nc.Flush(); err != nil {
		return "error: " + err.Error()
	}
	if isPermissionViolation(nc) {
		return "permission-violation"
	}
	if spy.reached(t, mark) {
		return "reached-tether"
	}
	return "dropped"
}

// requestProbe sends body (JSON; nil for none) to subject with a reply
// subject under the caller's inbox and classifies the first answer.
func requestProbe(t *testing.T, nc *nats.Conn, subject string, body any) string {
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return "error: " + err.Error()
	}
	defer sub.Unsubscribe()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: data}); err != nil {
		return "error: " + err.Error()
	}
	if err := nc.Flush(); err != nil {
		return "error: " + err.Error()
	}
	if isPermissionViolation(nc) {
		return "permission-violation"
	}
	m, err := sub.NextMsg(defaultTestTimeout)
	if err != nil {
		return "no answer (" + err.Error() + ")"
	}
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		return "no-responders"
	}
	if c := m.Header.Get(micro.ErrorCodeHeader); c != "" {
		code, err := strconv.Atoi(c)
		if err != nil {
			return "error code " + c
		}
		return statusOutcome(code)
	}
	return "ok"
}

// surfaceProtocolSubjects returns protocol's Subject* constants, name →
// value, parsed from its source (as natsauth's TestExportsCoverProtocol
// does), so a new subject cannot be missed.
func surfaceProtocolSubjects(t *testing.T) map[string]string {
	dir := filepath.Join("..", "..", "..", "..", "protocol")
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if !strings.HasPrefix(n.Name, "Subject") || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							t.Fatalf("protocol.%s is not a string literal", n.Name)
						}
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out[n.Name] = v
					}
				}
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d Subject constants in protocol: the parser broke", len(out))
	}
	return out
}

// ---- admin HTTP ----

// adminProbes are the admin server's requests: every route it registers
// and a few it does not. pattern is the route's pattern when it is not
// "METHOD PATH" (a path with wildcards filled in), "-" for a probe of no
// route.
var adminProbes = []struct{ method, path, pattern string }{
	{"GET", "/metrics", ""}, {"GET", "/healthz", ""}, {"GET", "/readyz", ""},
	{"POST", "/healthz", ""}, {"GET", "/", ""}, {"GET", "/debug/pprof/", ""}, {"GET", "/debug/vars", ""},
	// The web console (coordinator/console).
	{"GET", "/console/", "GET /console/{$}"},
	{"GET", "/console/nodes", ""},
	{"GET", "/console/jobs", ""},
	{"GET", "/console/jobs/no-such-job", "GET /console/jobs/{id}"},
	{"GET", "/console/jobs/no-such-job/output/surface-node/stdout?offset=0", "GET /console/jobs/{id}/output/{node}/{stream}"},
	{"GET", "/console/sandboxes", ""},
	{"GET", "/console/audit", ""},
	{"GET", "/console/static/console.css", "GET /console/static/"},
	{"GET", "/console/login", ""},
	{"GET", "/console/login?token=wrong-token-0123456789", "GET /console/login"},
	{"POST", "/console/login", ""},
	{"GET", "/console/logout", ""},
	{"DELETE", "/console/nodes", "-"},
}

// adminCallers are the admin server's callers: no credentials (the
// console sees the test's own uid on loopback, which policy does not
// name), a wrong bearer token and each role's token (the console's token
// file is the facades'), as Authorization: Bearer.
func adminCallers() []string { return facadeCallers()[:2+len(surfaceRoles)] }

// notCoordinatorHandlers are HTTP patterns registered in the module's
// code ("FILE PATTERN", see surfaceHTTPPatterns) that are not served by a
// coordinator listener.
// tunnelPortHandlers are the HTTP patterns of the tunnel port's WebSocket
// side (coordinator/websocket.go), probed by probeTunnel's "https" entries.
var tunnelPortHandlers = map[string]bool{
	"coordinator/websocket.go /": true,
}

var notCoordinatorHandlers = map[string]bool{
	"cmd/tether/internal/cli/agent.go GET /metrics": true, // the agent's own --metrics-addr
}

func probeAdmin(t *testing.T, cs *coordinatorServer, fc facadeCreds, tab *surfaceTable) (entries, callers []string) {
	probed := map[string]bool{}
	for _, p := range adminProbes {
		if p.pattern != "" {
			probed[p.pattern] = true
		} else {
			probed[p.method+" "+p.path] = true
		}
	}
	for _, h := range surfaceHTTPPatterns(t) {
		file, pat, _ := strings.Cut(h, " ")
		if !probed[pat] && !notCoordinatorHandlers[h] && !tunnelPortHandlers[h] {
			t.Errorf("%s registers HTTP route %q, which TestSurface does not probe: add it to adminProbes (or notCoordinatorHandlers) and review the new row", file, pat)
		}
	}
	hc := &http.Client{Timeout: defaultTestTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	callers = adminCallers()
	for _, p := range adminProbes {
		e := p.method + " " + p.path
		entries = append(entries, e)
		for _, c := range callers {
			req, err := http.NewRequest(p.method, "http://"+cs.info.AdminAddr+p.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c == "bad-token":
				req.Header.Set("Authorization", "Bearer surface-wrong-token-0123456789")
			case strings.HasPrefix(c, "token:"):
				req.Header.Set("Authorization", "Bearer "+fc.tokens[strings.TrimPrefix(c, "token:")])
			}
			resp, err := hc.Do(req)
			if err != nil {
				tab.add(lnAdmin, e, c, "error: "+err.Error())
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out := statusOutcome(resp.StatusCode)
			if resp.StatusCode == http.StatusNotFound {
				out = "unknown"
				if strings.HasPrefix(p.path, "/console/jobs/") {
					out = "ok:404" // the console's answer for a job one may not see, or that does not exist
				}
			}
			tab.add(lnAdmin, e, c, out)
		}
	}
	return entries, callers
}

// surfaceHTTPPatterns returns "FILE PATTERN" for every Handle and
// HandleFunc call with a literal pattern in the module's non-test code.
func surfaceHTTPPatterns(t *testing.T) []string {
	root := filepath.Join("..", "..", "..", "..")
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "e2e" || (strings.HasPrefix(n, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				v, _ := strconv.Unquote(lit.Value)
				out = append(out, filepath.ToSlash(rel)+" "+v)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 3 {
		t.Fatalf("found only %d HTTP patterns in the module: the scan broke", len(out))
	}
	return out
}

// ---- OpenSandbox facade ----

// openSandboxProbes are the facade's requests: one per route kind of
// protocol/opensandbox (TestSurface fails when a kind has none), the
// facade's own /health, and paths that are no route.
var openSandboxProbes = []struct{ method, path string }{
	{"GET", "/v1/sandboxes"},
	{"POST", "/v1/sandboxes"},
	{"GET", "/sandboxes"},
	{"GET", "/v1/sandboxes/sb-surface"},
	{"DELETE", "/v1/sandboxes/sb-surface"},
	{"GET", "/v1/sandboxes/sb-surface/endpoints/8080"},
	{"POST", "/v1/sandboxes/sb-surface/renew-expiration"},
	{"PATCH", "/v1/sandboxes/sb-surface/metadata"},
	{"POST", "/v1/sandboxes/sb-surface/pause"},
	{"POST", "/v1/sandboxes/sb-surface/resume"},
	{"GET", "/v1/sandboxes/sb-surface/proxy/8080/x"},
	{"GET", "/health"},
	{"GET", "/"},
	{"GET", "/v1/other"},
	{"GET", "/v1/sandboxes/sb-surface/unknown"},
}

// facadeCreds are what facade callers present: tokens by role, client
// certificates by caller name.
type facadeCreds struct {
	tokens map[string]string
	certs  map[string]tls.Certificate
}

// facadeCallers are the facades' callers: no token, a wrong one, each
// role's, a client certificate of the client CA (CN submitter) and one of
// another CA (CN admin).
func facadeCallers() []string {
	out := []string{"none", "bad-token"}
	for _, r := range surfaceRoles {
		out = append(out, "token:"+r)
	}
	return append(out, "cert:submitter", "cert:foreign-ca")
}

// token returns the token caller presents, "" for none.
func (fc facadeCreds) token(caller string) string {
	switch {
	case caller == "bad-token":
		return "surface-not-a-token-0123456789"
	case strings.HasPrefix(caller, "token:"):
		return fc.tokens[strings.TrimPrefix(caller, "token:")]
	}
	return ""
}

// tls returns the client TLS configuration of caller: base, with its
// certificate if it has one.
func (fc facadeCreds) tls(base *tls.Config, caller string) *tls.Config {
	c := base.Clone()
	if cert, ok := fc.certs[caller]; ok {
		// Presented whatever CAs the server names: Go's client would
		// otherwise send no certificate the server's CAs did not issue.
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return c
}

// badTokenSource returns the source address of the wrong-token caller's
// n-th facade probe (n >= 0; all of 127.0.0.0/8 is loopback on Linux):
// each probe has its own, so that no address fails twice and each cell
// shows what one wrong token gets, not the 429 of an address past the
// facades' burst of failures (authlimit, per source IP; the facades'
// Test*TokenGuessesThrottled test that).
func badTokenSource(n int) *net.TCPAddr {
	n++
	return &net.TCPAddr{IP: net.IPv4(127, 1, byte(n>>8), byte(n))}
}

// clientCert issues a client certificate with common name cn from ca.
func clientCert(t *testing.T, ca *tunnel.NodeCA, cn string) tls.Certificate {
	t.Helper()
	key, err := tunnel.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tunnel.NewNodeCSR(key, cn)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Sign(csr, cn, time.Now().Add(-time.Minute), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

func probeOpenSandbox(t *testing.T, cs *coordinatorServer, caFile string, fc facadeCreds, tab *surfaceTable) (entries, callers []string) {
	kinds := map[osb.RouteKind]bool{}
	for _, p := range openSandboxProbes {
		if r, ok := osb.ParsePath(p.path); ok {
			kinds[r.Kind] = true
		}
	}
	for k := osb.RouteKind(1); !strings.HasPrefix(k.String(), "RouteKind("); k++ {
		if !kinds[k] {
			t.Errorf("the OpenSandbox facade routes %s, which TestSurface does not probe: add a path to openSandboxProbes and review the new row", k)
		}
	}
	tlsCfg, err := tunnel.LoadClientTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	callers = facadeCallers()
	clients := map[string]*http.Client{}
	for _, c := range callers {
		tr := &http.Transport{TLSClientConfig: fc.tls(tlsCfg, c)}
		defer tr.CloseIdleConnections()
		clients[c] = &http.Client{Timeout: defaultTestTimeout, Transport: tr}
	}
	for i, p := range openSandboxProbes {
		e := p.method + " " + p.path
		entries = append(entries, e)
		for _, c := range callers {
			var body io.Reader
			if p.method == "POST" || p.method == "PATCH" {
				body = strings.NewReader(`{"image":{"uri":"surface"},"entrypoint":["true"],"timeout":60}`)
			}
			req, err := http.NewRequest(p.method, "https://"+cs.info.OpenSandboxAddr+p.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if body != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			if tok := fc.token(c); tok != "" {
				req.Header.Set(opensandbox.HeaderToken, tok)
			}
			hc := clients[c]
			if c == "bad-token" {
				d := &net.Dialer{LocalAddr: badTokenSource(i)}
				tr := &http.Transport{TLSClientConfig: fc.tls(tlsCfg, c), DialContext: d.DialContext, DisableKeepAlives: true}
				hc = &http.Client{Timeout: defaultTestTimeout, Transport: tr}
			}
			resp, err := hc.Do(req)
			if err != nil {
				// No HTTP answer at all: the TLS handshake was refused
				// (the alert or the reset that follows it, whichever
				// the client read first).
				t.Logf("opensandbox %s as %s: %v", e, c, err)
				tab.add(lnOpenSandbox, e, c, "refused-at-connect")
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			tab.add(lnOpenSandbox, e, c, httpOutcome(resp.StatusCode, b))
		}
	}
	return entries, callers
}

// httpOutcome classifies a facade's answer: status, and the facade's error
// code when it wrote one.
func httpOutcome(code int, body []byte) string {
	var eb struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	json.Unmarshal(body, &eb)
	switch {
	case code == http.StatusNotFound && eb.Detail == "Not Found":
		return "unknown"
	case code == 401 || code == 403 || code == 429:
		return strconv.Itoa(code)
	case code < 300:
		return "ok"
	case eb.Code != "":
		return "ok:" + strconv.Itoa(code) + " " + strings.TrimPrefix(eb.Code, "TETHER::")
	}
	return "ok:" + strconv.Itoa(code)
}

// ---- OpenShell facade ----

func probeOpenShell(t *testing.T, cs *coordinatorServer, caFile string, fc facadeCreds, tab *surfaceTable) (entries, callers []string) {
	svc := osh.File_openshell_proto.Services().ByName(protoreflect.Name(strings.TrimPrefix(osh.ServiceName, "openshell.v1.")))
	if svc == nil {
		t.Fatalf("service %s not in protocol/openshell's descriptor", osh.ServiceName)
	}
	type method struct {
		full           string
		in, out        protoreflect.MessageDescriptor
		client, server bool
	}
	var methods []method
	ms := svc.Methods()
	for i := 0; i < ms.Len(); i++ {
		m := ms.Get(i)
		methods = append(methods, method{"/" + osh.ServiceName + "/" + string(m.Name()), m.Input(), m.Output(), m.IsStreamingClient(), m.IsStreamingServer()})
	}
	if len(methods) < 5 {
		t.Fatalf("only %d methods in %s: the descriptor walk broke", len(methods), osh.ServiceName)
	}
	// Not methods of the service: the facade forwards unknown methods of
	// its service and refuses other services.
	hin := osh.File_openshell_proto.Messages().ByName("HealthRequest")
	hout := osh.File_openshell_proto.Messages().ByName("HealthResponse")
	methods = append(methods,
		method{"/" + osh.ServiceName + "/SurfaceNoSuchMethod", hin, hout, false, false},
		method{"/surface.v1.NoSuchService/Call", hin, hout, false, false})

	tlsCfg, err := tunnel.LoadClientTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	callers = facadeCallers()
	conns := map[string]*grpc.ClientConn{}
	for _, c := range callers {
		conn, err := grpc.NewClient(cs.info.OpenShellAddr, grpc.WithTransportCredentials(credentials.NewTLS(fc.tls(tlsCfg, c))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns[c] = conn
	}
	refused := map[string]bool{}
	for c, conn := range conns {
		refused[c] = !grpcConnects(t, conn)
	}
	for i, m := range methods {
		entries = append(entries, m.full)
		for _, c := range callers {
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			if refused[c] {
				cancel()
				tab.add(lnOpenShell, m.full, c, "refused-at-connect")
				continue
			}
			if tok := fc.token(c); tok != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, openshell.MetaToken, tok)
			}
			conn := conns[c]
			if c == "bad-token" {
				d := &net.Dialer{LocalAddr: badTokenSource(i)}
				bc, err := grpc.NewClient(cs.info.OpenShellAddr, grpc.WithTransportCredentials(credentials.NewTLS(fc.tls(tlsCfg, c))),
					grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
				if err != nil {
					t.Fatal(err)
				}
				defer bc.Close()
				conn = bc
			}
			in := dynamicpb.NewMessage(m.in)
			var err error
			if !m.client && !m.server {
				err = conn.Invoke(ctx, m.full, in, dynamicpb.NewMessage(m.out))
			} else {
				var st grpc.ClientStream
				st, err = conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.client, ServerStreams: m.server}, m.full)
				if err == nil {
					st.SendMsg(in)
					st.CloseSend()
					err = st.RecvMsg(dynamicpb.NewMessage(m.out))
				}
			}
			cancel()
			tab.add(lnOpenShell, m.full, c, grpcOutcome(err))
		}
	}
	return entries, callers
}

// grpcConnects reports whether conn becomes ready (the server completed
// the TLS handshake and sent its HTTP/2 preface) rather than failing.
func grpcConnects(t *testing.T, conn *grpc.ClientConn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure:
			return false
		default:
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatalf("OpenShell facade connection still %v after %v", s, defaultTestTimeout)
			}
		}
	}
}

func grpcOutcome(err error) string {
	if err == nil || errors.Is(err, io.EOF) {
		return "ok"
	}
	switch s, _ := status.FromError(err); s.Code().String() {
	case "Unauthenticated":
		return "401"
	case "PermissionDenied":
		return "403"
	case "ResourceExhausted":
		return "429"
	case "Unimplemented":
		return "unknown"
	default:
		return "ok:" + s.Code().String()
	}
}

// ---- tunnel ----

// tunnelProbe is one connection to the agent tunnel listener.
type tunnelProbe struct {
	entry, caller string
	plain         bool             // plain TCP, no TLS
	ws            bool             // the WebSocket transport (ALPN http/1.1, GET tunnel.WebSocketPath)
	http          string           // instead of a tunnel: "METHOD PATH" on the tunnel port's HTTP side
	text          bool             // over the WebSocket transport, a text message instead of yamux
	cert          *tls.Certificate // the client certificate, if any
	kind          protocol.Kind    // the first stream's kind; 0: control
	// frame returns the first frame on the first stream, if any.
	frame func(t *testing.T) (protocol.FrameType, any)
}

// probeTunnel tries the agent tunnel as agents and impostors would: hello
// and enroll with no credentials, a shared token, join tokens, node
// certificates; plain TCP; a first stream that is not the control stream.
func probeTunnel(t *testing.T, cs *coordinatorServer, agentDir string, tab *surfaceTable) (entries, callers []string) {
	id, err := tunnel.LoadIdentity(filepath.Join(agentDir, agent.DefaultIdentityDirName))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	probeTok, _, err := cs.ids.CreateToken(ctx, 10*time.Minute, 1, nil, "surface-test")
	if err != nil {
		t.Fatal(err)
	}
	hello := func(node, token string) func(*testing.T) (protocol.FrameType, any) {
		return func(*testing.T) (protocol.FrameType, any) {
			return protocol.FrameHello, protocol.Hello{ProtocolVersion: protocol.Version, NodeID: node, Token: token, Instance: "surface-" + node}
		}
	}
	enroll := func(node, token string) func(*testing.T) (protocol.FrameType, any) {
		return func(t *testing.T) (protocol.FrameType, any) {
			key, err := tunnel.NewNodeKey()
			if err != nil {
				t.Fatal(err)
			}
			csr, err := tunnel.NewNodeCSR(key, node)
			if err != nil {
				t.Fatal(err)
			}
			return protocol.FrameEnroll, protocol.Enroll{ProtocolVersion: protocol.Version, Token: token, NodeID: node, CSR: csr}
		}
	}
	nodeCert := "node-cert " + surfaceNode
	probes := []tunnelProbe{
		{entry: "plain TCP, no TLS", caller: "none", plain: true},
		{entry: "hello", caller: "none", frame: hello(surfaceProbeNode, "")},
		{entry: "hello", caller: "shared-token", frame: hello(surfaceProbeNode, "surface-shared-token")},
		{entry: "hello", caller: "join-token", frame: hello(surfaceProbeNode, probeTok)},
		{entry: "hello " + surfaceNode, caller: nodeCert, cert: id.TLSCertificate(), frame: hello(surfaceNode, "")},
		{entry: "hello another node", caller: nodeCert, cert: id.TLSCertificate(), frame: hello(surfaceProbeNode, "")},
		{entry: "first stream exec", caller: nodeCert, cert: id.TLSCertificate(), kind: protocol.KindExec},
		{entry: "enroll", caller: "bad-join-token", frame: enroll(surfaceProbeNode, "tjt_surfacenotatoken")},
		{entry: "enroll", caller: "join-token", frame: enroll(surfaceProbeNode, probeTok)},
		{entry: "enroll", caller: "join-token (used)", frame: enroll(surfaceProbeNode+"-2", probeTok)},
		{entry: "enroll " + surfaceNode, caller: nodeCert, cert: id.TLSCertificate(), frame: enroll(surfaceNode, "")},
		// The WebSocket transport on the same port: the same handshake
		// behind the upgrade, refused the same way.
		{entry: "wss hello", caller: "none", ws: true, frame: hello(surfaceProbeNode, "")},
		{entry: "wss hello", caller: "shared-token", ws: true, frame: hello(surfaceProbeNode, "surface-shared-token")},
		{entry: "wss hello another node", caller: nodeCert, ws: true, cert: id.TLSCertificate(), frame: hello(surfaceProbeNode, "")},
		{entry: "wss enroll", caller: "bad-join-token", ws: true, frame: enroll(surfaceProbeNode, "tjt_surfacenotatoken")},
		{entry: "wss text message", caller: "none", ws: true, text: true},
		{entry: "https GET " + tunnel.WebSocketPath + " (no upgrade)", caller: "none", http: "GET " + tunnel.WebSocketPath},
		{entry: "https GET /", caller: "none", http: "GET /"},
		{entry: "https GET /metrics", caller: "none", http: "GET /metrics"},
	}
	for _, p := range probes {
		if !slices.Contains(entries, p.entry) {
			entries = append(entries, p.entry)
		}
		if !slices.Contains(callers, p.caller) {
			callers = append(callers, p.caller)
		}
		tab.add(lnTunnel, p.entry, p.caller, tunnelAttempt(t, cs, p))
	}
	return entries, callers
}

// tunnelAttempt makes p's connection and classifies the answer.
func tunnelAttempt(t *testing.T, cs *coordinatorServer, p tunnelProbe) string {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	addr := dialAddr(cs.info.TunnelAddr)
	if p.plain {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		s, err := tunnel.Client(c, tunnel.DefaultConfig())
		if err != nil {
			return "refused-at-connect"
		}
		defer s.Close()
		if _, err := s.Open(ctx, protocol.KindControl, protocol.ControlParams{}); err != nil {
			return "refused-at-connect"
		}
		// The server reads a record that is not TLS, fails, and closes.
		select {
		case <-s.Done():
			return "refused-at-connect"
		case <-ctx.Done():
			return "no answer"
		}
	}
	cfg, err := tunnel.LoadClientTLS(cs.info.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if p.cert != nil {
		cfg.Certificates = []tls.Certificate{*p.cert}
	}
	if p.http != "" {
		return tunnelHTTPAttempt(ctx, addr, cfg, p.http)
	}
	if p.text {
		return tunnelTextAttempt(addr, cfg)
	}
	var c net.Conn
	if p.ws {
		d := tunnel.WebSocketDialer{TLS: cfg}
		c, err = d.Dial(ctx, addr)
	} else {
		c, err = tunnel.DialTLS(ctx, addr, cfg)
	}
	if err != nil {
		return "refused-at-connect"
	}
	defer c.Close()
	// yamux itself rather than tunnel.Session: a write can fail although
	// its bytes went out (yamux tells a writer that raced with the
	// answer and the close that follows a refusal that the session
	// ended), and tunnel.Session.Open closes the stream when its header
	// write fails. The answer is in the stream's buffer either way.
	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	y, err := yamux.Client(c, ycfg)
	if err != nil {
		return "error: " + err.Error()
	}
	defer y.Close()
	st, err := y.OpenStream()
	if err != nil {
		return "open: " + err.Error()
	}
	defer st.Close()
	kind, params := p.kind, any(protocol.ControlParams{})
	if kind == 0 {
		kind = protocol.KindControl
	} else {
		params = protocol.ExecParams{Argv: []string{"true"}}
	}
	werr := protocol.WriteHeader(st, kind, params)
	if p.frame != nil {
		ft, v := p.frame(t)
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := protocol.WriteFrame(st, ft, b); werr == nil {
			werr = err
		}
	}
	st.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil {
		return fmt.Sprintf("read: %v (write: %v)", err, werr)
	}
	switch f.Type {
	case protocol.FrameWelcome, protocol.FrameEnrolled:
		return "ok"
	case protocol.FrameReject, protocol.FrameError:
		var ei protocol.ErrorInfo
		json.Unmarshal(f.Payload, &ei)
		return "refused:" + ei.Code
	}
	return "frame " + f.Type.String()
}

// tunnelHTTPAttempt sends req ("METHOD PATH") to the HTTP side of the
// tunnel port (ALPN http/1.1) and classifies the status.
func tunnelHTTPAttempt(ctx context.Context, addr string, cfg *tls.Config, req string) string {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{tunnel.ALPNHTTP}
	hc := &http.Client{Timeout: defaultTestTimeout, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	method, path, _ := strings.Cut(req, " ")
	r, err := http.NewRequestWithContext(ctx, method, "https://"+addr+path, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	resp, err := hc.Do(r)
	if err != nil {
		return "error: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return "unknown"
	}
	return statusOutcome(resp.StatusCode)
}

// tunnelTextAttempt upgrades to the WebSocket transport and sends a text
// message where the tunnel's binary messages go.
func tunnelTextAttempt(addr string, cfg *tls.Config) string {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{tunnel.ALPNHTTP}
	d := websocket.Dialer{TLSClientConfig: cfg, HandshakeTimeout: defaultTestTimeout}
	ws, _, err := d.Dial("wss://"+addr+tunnel.WebSocketPath, nil)
	if err != nil {
		return "refused-at-connect"
	}
	defer ws.Close()
	ws.WriteMessage(websocket.TextMessage, []byte("{}"))
	ws.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	_, _, err = ws.ReadMessage()
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Sprintf("closed:%d", ce.Code)
	}
	return fmt.Sprintf("read: %v", err)
}
