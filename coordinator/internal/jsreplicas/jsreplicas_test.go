package jsreplicas_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
)

const defaultTestTimeout = 60 * time.Second

// testLog is where the cluster tests' stores log (to the test's output
// with -v).
var testLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

// logRecords is a slog handler keeping each record's message and
// attributes as one line.
type logRecords struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "waited" {
			line += " " + a.String()
		}
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

func (l *logRecords) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// TestCreateLogsEachUnansweredCall: every create call that goes
// unanswered (or is answered unavailable) is logged as a warning naming
// the store, the replica count and the attempt, and asked again.
func TestCreateLogsEachUnansweredCall(t *testing.T) {
	defer jsreplicas.SetAttemptTimeout(jsreplicas.SetAttemptTimeout(50 * time.Millisecond))
	logs := &logRecords{}
	calls := 0
	unavail := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	r, err := jsreplicas.Create(testContext(t), jsreplicas.Store{Name: "job store bucket tether_jobs", Replicas: 3, Log: slog.New(logs)}, func(ctx context.Context, r int) error {
		calls++
		switch calls {
		case 1, 2: // unanswered
			<-ctx.Done()
			return ctx.Err()
		case 3:
			return unavail
		}
		return nil
	})
	got := logs.all()
	want := []string{
		"WARN still waiting for JetStream to create a store; asking again store=job store bucket tether_jobs replicas=3 attempt=1 why=unanswered within 50ms",
		"WARN still waiting for JetStream to create a store; asking again store=job store bucket tether_jobs replicas=3 attempt=2 why=unanswered within 50ms",
		"WARN still waiting for JetStream to create a store; asking again store=job store bucket tether_jobs replicas=3 attempt=3 why=" + unavail.Error(),
	}
	if r != 3 || err != nil || calls != 4 || !slices.Equal(got, want) {
		t.Errorf("Create: %d, %v after %d calls, logs:\n%s\nwant 3 after 4 calls, logs:\n%s", r, err, calls, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCreateFindsStoreWhoseCreateWentUnanswered: after a create call that
// went unanswered, a store that exists with the replica count asked for
// counts as created (its answer is what got lost: nats-server 2.15 with
// concurrent creates); one with another count is asked for again.
func TestCreateFindsStoreWhoseCreateWentUnanswered(t *testing.T) {
	defer jsreplicas.SetAttemptTimeout(jsreplicas.SetAttemptTimeout(50 * time.Millisecond))
	hang := func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }
	logs := &logRecords{}
	looks := 0
	r, err := jsreplicas.Create(testContext(t), jsreplicas.Store{Name: "fleet bucket tether_nodes", Log: slog.New(logs), Exists: func(context.Context) (int, bool, error) {
		looks++
		return 3, true, nil
	}}, hang)
	if r != 3 || err != nil || looks != 1 {
		t.Errorf("Create: %d, %v after %d looks; want 3 after one", r, err, looks)
	}
	if got := logs.all(); len(got) != 1 || !strings.HasPrefix(got[0], "INFO JetStream store found created although its create went unanswered store=fleet bucket tether_nodes replicas=3 attempt=1") {
		t.Errorf("logs %q", got)
	}

	// Found with 1 replica while 3 are asked for (a scale-up whose answer
	// is late): not taken for created.
	ctx, cancel := context.WithTimeout(testContext(t), time.Second)
	defer cancel()
	looks = 0
	_, err = jsreplicas.Create(ctx, jsreplicas.Store{Replicas: 3, Exists: func(context.Context) (int, bool, error) {
		looks++
		return 1, true, nil
	}}, hang)
	if err == nil || looks < 2 {
		t.Errorf("store found with 1 replica of 3: %v after %d looks; want asked again until ctx ended", err, looks)
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// TestCreateStopsAtOtherErrors: only "cannot place that many" moves on to
// fewer replicas; any other error ends the trial at once, naming the count.
func TestCreateStopsAtOtherErrors(t *testing.T) {
	var tried []int
	bad := errors.New("stream name already in use with a different configuration")
	_, err := jsreplicas.Create(context.Background(), jsreplicas.Store{Replicas: 0}, func(_ context.Context, r int) error { tried = append(tried, r); return bad })
	if !errors.Is(err, bad) || !strings.Contains(err.Error(), "replicas 3") || fmt.Sprint(tried) != "[3]" {
		t.Errorf("err %v after tries %v, want the error itself after [3]", err, tried)
	}
	tried = nil
	few := &jetstream.APIError{Code: 500, ErrorCode: 10023, Description: "insufficient resources"}
	_, err = jsreplicas.Create(context.Background(), jsreplicas.Store{Replicas: 0}, func(_ context.Context, r int) error { tried = append(tried, r); return few })
	if !errors.Is(err, few) || fmt.Sprint(tried) != "[3 3 2 2 1]" {
		t.Errorf("err %v after tries %v, want insufficient resources after [3 3 2 2 1] (a cluster's refusal asked again once)", err, tried)
	}
	tried = nil
	notCluster := &jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}
	_, err = jsreplicas.Create(context.Background(), jsreplicas.Store{Replicas: 0}, func(_ context.Context, r int) error { tried = append(tried, r); return notCluster })
	if !errors.Is(err, notCluster) || fmt.Sprint(tried) != "[3 2 1]" {
		t.Errorf("err %v after tries %v, want not clustered after [3 2 1] (no count asked twice)", err, tried)
	}
	tried = nil
	if r, err := jsreplicas.Create(context.Background(), jsreplicas.Store{Replicas: 2}, func(_ context.Context, r int) error { tried = append(tried, r); return nil }); r != 2 || err != nil || fmt.Sprint(tried) != "[2]" {
		t.Errorf("forced 2: %d, %v after %v", r, err, tried)
	}
	if _, err := jsreplicas.Create(context.Background(), jsreplicas.Store{Replicas: 6}, func(context.Context, int) error { return nil }); err == nil {
		t.Error("replicas 6 accepted")
	}
}

// TestCreateRacingCreators: coordinators starting together on a fresh
// cluster. One is refused placement for 3 replicas (a peer not current
// yet) while another's create of 3 lands: asked again, the first gets 3
// too instead of stepping down (it used to create or find the store with
// 2, or fail); and one that stepped down anyway and finds the name taken
// (10058: the other's store landed between its look and its create) keeps
// the other's store and says 3. CI saw TestClusterOfThree fail this way.
func TestCreateRacingCreators(t *testing.T) {
	noPeers := &jetstream.APIError{Code: 500, ErrorCode: 10005, Description: "no suitable peers for placement"}
	var tried []int
	r, err := jsreplicas.Create(testContext(t), jsreplicas.Store{Exists: func(context.Context) (int, bool, error) { return 0, false, nil }}, func(_ context.Context, r int) error {
		tried = append(tried, r)
		if len(tried) == 1 {
			return noPeers
		}
		return nil
	})
	if r != 3 || err != nil || fmt.Sprint(tried) != "[3 3]" {
		t.Errorf("refused once: %d, %v after tries %v; want 3 after [3 3]", r, err, tried)
	}

	inUse := &jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}
	tried = nil
	looks := 0
	r, err = jsreplicas.Create(testContext(t), jsreplicas.Store{Exists: func(context.Context) (int, bool, error) {
		looks++
		if looks == 1 { // the look after 3 was refused: not there yet
			return 0, false, nil
		}
		return 3, true, nil
	}}, func(_ context.Context, r int) error {
		tried = append(tried, r)
		if r == 3 {
			return noPeers
		}
		return inUse
	})
	if r != 3 || err != nil || fmt.Sprint(tried) != "[3 3 2]" {
		t.Errorf("stepped down into the other's store: %d, %v after tries %v; want 3 after [3 3 2]", r, err, tried)
	}
}

// TestCreateWaitsWhileUnavailable: a cluster electing its leaders (just
// restarted) answers 10008 "temporarily unavailable"; the create is made
// again until it succeeds, at the same replica count.
func TestCreateWaitsWhileUnavailable(t *testing.T) {
	var tried []int
	unavail := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	r, err := jsreplicas.Create(testContext(t), jsreplicas.Store{}, func(_ context.Context, r int) error {
		tried = append(tried, r)
		if len(tried) < 3 {
			return unavail
		}
		return nil
	})
	if r != 3 || err != nil || fmt.Sprint(tried) != "[3 3 3]" {
		t.Errorf("Create: %d, %v after tries %v; want 3, nil after [3 3 3]", r, err, tried)
	}
}

// runServer starts a JetStream server on loopback; with routes, a member
// of cluster "c" listening for routes on clusterPort.
func runServer(t *testing.T, name string, clusterPort int, routes []string) *server.Server {
	t.Helper()
	o := &server.Options{
		ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	}
	if clusterPort != 0 {
		o.Cluster = server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: clusterPort}
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(defaultTestTimeout) {
		t.Fatalf("server %s not ready", name)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func connect(t *testing.T, s *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func openStream(ctx context.Context, js jetstream.JetStream, name string, want int) (int, error) {
	var st jetstream.Stream
	return jsreplicas.Create(ctx, jsreplicas.Store{Name: "stream " + name, Replicas: want, Log: testLog, Exists: jsreplicas.StreamExists(js, name, &st)}, func(ctx context.Context, r int) error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage, Replicas: r})
		return err
	})
}

func openBucket(ctx context.Context, js jetstream.JetStream, name string, want int) (int, error) {
	var kv jetstream.KeyValue
	return jsreplicas.Create(ctx, jsreplicas.Store{Name: "bucket " + name, Replicas: want, Log: testLog, Exists: jsreplicas.BucketExists(js, name, &kv)}, func(ctx context.Context, r int) error {
		_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1, Replicas: r})
		return err
	})
}

func streamReplicas(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) int {
	t.Helper()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.Config.Replicas
}

// TestSingleServerFallsBackToOne: a server that is not clustered refuses
// replicas above 1, and Create settles on 1 for streams and buckets; a
// forced 2 is refused with the server's reason.
func TestSingleServerFallsBackToOne(t *testing.T) {
	ctx := testContext(t)
	js := connect(t, runServer(t, "solo", 0, nil))
	if r, err := openStream(ctx, js, "S", 0); r != 1 || err != nil {
		t.Fatalf("stream: replicas %d, %v; want 1", r, err)
	}
	if got := streamReplicas(t, ctx, js, "S"); got != 1 {
		t.Errorf("stream S has %d replicas, want 1", got)
	}
	if r, err := openBucket(ctx, js, "kv", 0); r != 1 || err != nil {
		t.Fatalf("bucket: replicas %d, %v; want 1", r, err)
	}
	// Opening again binds the same stream.
	if r, err := openStream(ctx, js, "S", 0); r != 1 || err != nil {
		t.Fatalf("stream again: replicas %d, %v", r, err)
	}
	if _, err := openStream(ctx, js, "T", 2); !jsreplicas.TooFewPeers(err) {
		t.Errorf("forced replicas 2 on one server: %v, want the server's refusal", err)
	}
}

// TestClusterOfThree: on a 3-server cluster Create places 3 replicas; a
// stream and a bucket created with 1 (an older release) are scaled up to 3
// when opened again; with one server down an existing R3 stream stays R3
// (no scale-down) and its data is readable, and a new stream still opens.
func TestClusterOfThree(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-server JetStream cluster")
	}
	ctx := testContext(t)
	var ports []int
	var routes []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port))
		ln.Close()
	}
	var srvs []*server.Server
	for i := range 3 {
		srvs = append(srvs, runServer(t, fmt.Sprintf("n%d", i), ports[i], routes))
	}
	// The cluster's meta leader takes a moment to be elected.
	for deadline := time.Now().Add(defaultTestTimeout); ; time.Sleep(50 * time.Millisecond) {
		leaders := 0
		for _, s := range srvs {
			if s.JetStreamIsLeader() {
				leaders++
			}
		}
		if leaders == 1 && srvs[0].JetStreamIsCurrent() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 3 servers elected no JetStream meta leader")
		}
	}
	// Every coordinator opens the same buckets as it starts: three at
	// once, one per server, must all get 3 replicas (nats-server can
	// leave such concurrent requests unanswered; Create asks again).
	var wg sync.WaitGroup
	got := make([]string, 3)
	for i, s := range srvs {
		js := connect(t, s)
		wg.Go(func() {
			r, err := openBucket(ctx, js, "together", 0)
			got[i] = fmt.Sprintf("%d %v", r, err)
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != "3 <nil>" {
			t.Errorf("bucket opened at once through server %d: %s; want 3 replicas", i, g)
		}
	}

	js := connect(t, srvs[0])
	r, err := openStream(ctx, js, "S", 0)
	if r != 3 || err != nil {
		t.Fatalf("stream on 3 servers: replicas %d, %v; want 3", r, err)
	}

	// Created R1 (as before this package), then opened with auto.
	if r, err := openStream(ctx, js, "OLD", 1); r != 1 || err != nil {
		t.Fatalf("forced R1: %d, %v", r, err)
	}
	if _, err := js.Publish(ctx, "OLD.x", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if r, err := openStream(ctx, js, "OLD", 0); r != 3 || err != nil {
		t.Fatalf("R1 stream reopened: replicas %d, %v; want scaled to 3", r, err)
	}
	if got := streamReplicas(t, ctx, js, "OLD"); got != 3 {
		t.Errorf("stream OLD has %d replicas after the update, want 3", got)
	}
	if r, err := openBucket(ctx, js, "oldkv", 1); r != 1 || err != nil {
		t.Fatalf("forced R1 bucket: %d, %v", r, err)
	}
	if r, err := openBucket(ctx, js, "oldkv", 0); r != 3 || err != nil {
		t.Fatalf("R1 bucket reopened: replicas %d, %v; want scaled to 3", r, err)
	}

	// A scale-up is applied in the background: the stream's config says
	// 3 at once, but its new peers join and catch up later. Until they
	// have, the one server holding the data is all of it, and shutting
	// that one down leaves the stream offline (10118) until it returns,
	// as nats-server means it to. Wait for three current peers.
	waitCurrentPeers(t, ctx, js, "OLD", 3)

	// One server of three down.
	srvs[2].Shutdown()
	srvs[2].WaitForShutdown()
	for deadline := time.Now().Add(defaultTestTimeout); ; time.Sleep(200 * time.Millisecond) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err = openStream(actx, js, "OLD", 0)
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if r != 3 || err != nil {
		t.Fatalf("R3 stream reopened with a server down: replicas %d, %v; want 3 (no scale-down)", r, err)
	}
	st, err := js.Stream(ctx, "OLD")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.GetMsg(ctx, 1); err != nil || string(m.Data) != "kept" {
		t.Errorf("message 1 of OLD with a server down: %v, %v", m, err)
	}
	// A new stream still opens (the servers may place all 3 replicas,
	// the offline one catching up when it returns, or fewer).
	if r, err = openStream(ctx, js, "NEW", 0); err != nil {
		t.Errorf("new stream with one server of three down: %v", err)
	}
	t.Logf("new stream with one server of three down: %d replicas", r)
}

// waitCurrentPeers waits until stream name has a leader and want-1
// other peers, all current.
func waitCurrentPeers(t *testing.T, ctx context.Context, js jetstream.JetStream, name string, want int) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(defaultTestTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := js.Stream(ctx, name)
		if err != nil {
			last = err.Error()
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			last = err.Error()
			continue
		}
		c := info.Cluster
		if c == nil || c.Leader == "" {
			last = "no leader"
			continue
		}
		current := 1
		for _, p := range c.Replicas {
			if p.Current {
				current++
			}
		}
		if current >= want {
			return
		}
		last = fmt.Sprintf("leader %s and %d current peers of %d", c.Leader, current-1, len(c.Replicas))
	}
	t.Fatalf("stream %s never had %d current peers: %s", name, want, last)
}

// TestClusterStartTogether: three coordinators starting at once on a
// fresh 3-server cluster each open the same stores one after another (as
// tether coordinator does: fleet, ledger, enrollment, audit, jobs), one
// coordinator per server; every store opens with 3 replicas through each.
// The warnings (each create call left unanswered) are logged with -v.
func TestClusterStartTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-server JetStream cluster")
	}
	// Eight stores, each of which may cost an unanswered create or two
	// on a loaded machine: more room than testContext's.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ports []int
	var routes []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port))
		ln.Close()
	}
	var srvs []*server.Server
	for i := range 3 {
		srvs = append(srvs, runServer(t, fmt.Sprintf("n%d", i), ports[i], routes))
	}
	// No wait for the meta leader: coordinators do not wait either.
	logs := &logRecords{}
	var wg sync.WaitGroup
	errs := make([][]string, 3)
	for i, s := range srvs {
		js := connect(t, s)
		wg.Go(func() {
			for k := range 4 {
				for _, open := range []func() (int, error){
					func() (int, error) { return openBucketLogged(ctx, js, fmt.Sprintf("b%d", k), slog.New(logs)) },
					func() (int, error) { return openStreamLogged(ctx, js, fmt.Sprintf("S%d", k), slog.New(logs)) },
				} {
					if r, err := open(); r != 3 || err != nil {
						errs[i] = append(errs[i], fmt.Sprintf("store %d: replicas %d, %v", k, r, err))
					}
				}
			}
		})
	}
	wg.Wait()
	for i, e := range errs {
		if len(e) > 0 {
			t.Errorf("through server %d: %s; want 3 replicas each", i, strings.Join(e, "; "))
		}
	}
	for _, l := range logs.all() {
		t.Log(l)
	}
}

func openStreamLogged(ctx context.Context, js jetstream.JetStream, name string, log *slog.Logger) (int, error) {
	var st jetstream.Stream
	return jsreplicas.Create(ctx, jsreplicas.Store{Name: "stream " + name, Log: log, Exists: jsreplicas.StreamExists(js, name, &st)}, func(ctx context.Context, r int) error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage, Replicas: r})
		return err
	})
}

func openBucketLogged(ctx context.Context, js jetstream.JetStream, name string, log *slog.Logger) (int, error) {
	var kv jetstream.KeyValue
	return jsreplicas.Create(ctx, jsreplicas.Store{Name: "bucket " + name, Log: log, Exists: jsreplicas.BucketExists(js, name, &kv)}, func(ctx context.Context, r int) error {
		_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1, Replicas: r})
		return err
	})
}
