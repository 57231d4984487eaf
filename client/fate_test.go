package client_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// records answers tether.v1.job.get from a map the test fills (a job
// store's records, as any coordinator would answer); an id it lacks is 404.
type records struct {
	mu   sync.Mutex
	recs map[string]protocol.JobRecord
	// hidden are ids whose record the caller may not see (404 not_found
	// even when asked as the submitter).
	hidden map[string]bool
	mine   int // checks asked as the submitter (JobGetRequest.Mine)
}

func serveRecords(t *testing.T, nc *nats.Conn) *records {
	t.Helper()
	r := &records{recs: map[string]protocol.JobRecord{}, hidden: map[string]bool{}}
	if _, err := nc.Subscribe(protocol.SubjectJobGet, func(m *nats.Msg) {
		var req protocol.JobGetRequest
		json.Unmarshal(m.Data, &req)
		r.mu.Lock()
		rec, ok := r.recs[req.ID]
		hidden := r.hidden[req.ID]
		if req.Mine {
			r.mine++
		}
		r.mu.Unlock()
		switch {
		case hidden:
			microError(m, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job %s", req.ID))
			return
		case !ok && req.Mine:
			microError(m, protocol.NewAPIError(404, protocol.ErrCodeNotRecorded, "no job %s submitted by you is recorded", req.ID))
			return
		case !ok:
			microError(m, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job %s", req.ID))
			return
		}
		b, _ := json.Marshal(rec)
		m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return r
}

func (r *records) set(rec protocol.JobRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs[rec.ID] = rec
}

func fateClient(t *testing.T, nc *nats.Conn) *client.Client {
	c := client.New(nc)
	c.FateCheckAfter = 50 * time.Millisecond
	c.KeepAliveTimeout = 10 * time.Minute // an outcome must come from the record
	return c
}

// A job whose coordinator went silent and whose record says lost ends at
// once, each node carrying the record's reason.
func TestExecFateLost(t *testing.T) {
	s := runServer(t)
	var recs *records
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		// Accepted, then the coordinator died: no reply ever comes.
		recs.set(protocol.JobRecord{ID: req.ID, State: protocol.JobStateLost, Nodes: []string{"n1"}, Error: "its coordinator stopped while it ran"})
	}, nil)
	recs = serveRecords(t, f.nc)
	res, err := fateClient(t, connect(t, s)).Exec(testCtx(t), echoReq(), nil)
	if err != nil || len(res.Results) != 1 || res.Results[0].ExitCode != -1 || res.Failed != 1 ||
		!strings.Contains(res.Results[0].Error, "lost: its coordinator stopped while it ran") {
		t.Fatalf("result %+v, %v; want node n1 lost with the record's reason", res, err)
	}
}

// A record that ended normally while no result reply came (the reply
// died with its coordinator) gives the record's results, after one more
// check's wait for the reply; a record still running keeps the client
// waiting.
func TestExecFateFromEndedRecord(t *testing.T) {
	s := runServer(t)
	var recs *records
	started := make(chan string, 1)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		recs.set(protocol.JobRecord{ID: req.ID, State: protocol.JobStateRunning, Nodes: []string{"n1"}})
		started <- req.ID
	}, nil)
	recs = serveRecords(t, f.nc)
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := fateClient(t, connect(t, s)).Exec(testCtx(t), echoReq(), nil)
		done <- outcome{res, err}
	}()
	id := <-started
	select {
	case o := <-done:
		t.Fatalf("returned while the record says running: %+v, %v", o.res, o.err)
	case <-time.After(500 * time.Millisecond): // ten checks
	}
	recs.set(protocol.JobRecord{ID: id, State: protocol.JobFailed, Nodes: []string{"n1"}, Failed: 1,
		Results: []protocol.NodeResult{{Node: "n1", ExitCode: 3}}})
	o := <-done
	if o.err != nil || o.res.ID != id || len(o.res.Results) != 1 || o.res.Results[0].ExitCode != 3 || o.res.Failed != 1 {
		t.Fatalf("result %+v, %v; want the record's: n1 exit 3", o.res, o.err)
	}
}

// A lost idempotent job is submitted again under a new id with its first
// id as the idempotency key, and the caller is told; the new attempt's
// result is the outcome, and req names the new attempt.
func TestExecIdempotentRerun(t *testing.T) {
	s := runServer(t)
	var recs *records
	var mu sync.Mutex
	var seen []protocol.ExecRequest
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		mu.Lock()
		seen = append(seen, req)
		first := len(seen) == 1
		mu.Unlock()
		if first {
			recs.set(protocol.JobRecord{ID: req.ID, State: protocol.JobStateLost, Nodes: []string{"n1"}, Error: "its coordinator stopped while it ran"})
			return
		}
		f.result(m, req.ID, 0, protocol.ExecResult{ID: req.ID, Nodes: 1, Succeeded: 1, Results: []protocol.NodeResult{{Node: "n1"}}})
	}, nil)
	recs = serveRecords(t, f.nc)
	req := echoReq()
	req.ID, req.Idempotent = "first-attempt", true
	var told []string
	res, err := fateClient(t, connect(t, s)).ExecWith(testCtx(t), req, client.ExecOptions{
		Rerun: func(lost, next, why string) { told = append(told, lost+" "+next+" "+why) }})
	if err != nil || res.Succeeded != 1 {
		t.Fatalf("result %+v, %v; want the second attempt's success", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[1].ID == "first-attempt" || seen[1].IdempotencyKey != "first-attempt" || !seen[1].Idempotent {
		t.Fatalf("submissions %+v; want a second one under a new id keyed by the first id", seen)
	}
	if req.ID != seen[1].ID || len(told) != 1 || !strings.HasPrefix(told[0], "first-attempt "+seen[1].ID) || !strings.Contains(told[0], "coordinator stopped") {
		t.Errorf("req.ID %s, told %q", req.ID, told)
	}
	// Not idempotent: no second submission.
	seen = seen[:0]
	mu.Unlock()
	plain := echoReq()
	res, err = fateClient(t, connect(t, s)).Exec(testCtx(t), plain, nil)
	mu.Lock()
	if err != nil || res.Failed != 1 || len(seen) != 1 {
		t.Errorf("a lost job that is not idempotent: %+v, %v after %d submissions; want lost, one submission", res, err, len(seen))
	}
}

// A job whose request reached a coordinator that died before recording
// it (no reply ever, and the store has no record of it as the caller's)
// ends with ErrNotRecorded after a confirming second check, instead of
// waiting for the keepalive timeout; an idempotent one is submitted again.
func TestExecFateNotRecorded(t *testing.T) {
	s := runServer(t)
	var mu sync.Mutex
	var seen []protocol.ExecRequest
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		mu.Lock()
		seen = append(seen, req)
		n := len(seen)
		mu.Unlock()
		if n == 3 { // the idempotent job's second attempt runs
			f.result(m, req.ID, 0, protocol.ExecResult{ID: req.ID, Nodes: 1, Succeeded: 1, Results: []protocol.NodeResult{{Node: "n1"}}})
		}
		// Else its coordinator died before recording it: no reply, no record.
	}, nil)
	recs := serveRecords(t, f.nc)
	res, err := fateClient(t, connect(t, s)).Exec(testCtx(t), echoReq(), nil)
	if !errors.Is(err, client.ErrNotRecorded) || res != nil || !strings.Contains(err.Error(), "did not run") {
		t.Fatalf("result %+v, %v; want ErrNotRecorded", res, err)
	}
	recs.mu.Lock()
	if recs.mine < 2 {
		t.Errorf("%d checks asked as the submitter; want 2 (one to find no record, one to confirm)", recs.mine)
	}
	recs.mu.Unlock()

	req := echoReq()
	req.Idempotent = true
	var told []string
	res, err = fateClient(t, connect(t, s)).ExecWith(testCtx(t), req, client.ExecOptions{
		Rerun: func(first, next, why string) { told = append(told, first+" "+next+" "+why) }})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || res.Succeeded != 1 || len(seen) != 3 || req.ID != seen[2].ID || len(told) != 1 || !strings.Contains(told[0], "did not run") {
		t.Fatalf("idempotent: %+v, %v after submissions %+v, told %q; want a second attempt's success", res, err, seen, told)
	}
}

// A 404 that may mean "not yours to see" (not_found, even asked as the
// submitter) keeps the client waiting, as does a record of its own.
func TestExecFateHiddenKeepsWaiting(t *testing.T) {
	s := runServer(t)
	var recs *records
	started := make(chan string, 1)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		recs.mu.Lock()
		recs.hidden[req.ID] = true
		recs.mu.Unlock()
		started <- req.ID
	}, nil)
	recs = serveRecords(t, f.nc)
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := fateClient(t, connect(t, s)).Exec(testCtx(t), echoReq(), nil)
		done <- outcome{res, err}
	}()
	id := <-started
	select {
	case o := <-done:
		t.Fatalf("returned on a hidden record: %+v, %v", o.res, o.err)
	case <-time.After(client.NotRecordedConfirm + time.Second): // many checks, past the confirmation
	}
	recs.mu.Lock()
	delete(recs.hidden, id)
	recs.recs[id] = protocol.JobRecord{ID: id, State: protocol.JobStateLost, Nodes: []string{"n1"}, Error: "its coordinator stopped while it ran"}
	recs.mu.Unlock()
	if o := <-done; o.err != nil || o.res.Failed != 1 {
		t.Fatalf("result %+v, %v; want the record's: lost", o.res, o.err)
	}
}
