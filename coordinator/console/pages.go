package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Bounds of what one page reads and shows.
const (
	// readTimeout bounds a page's reads of the job store, the audit
	// stream and a node's tunnel.
	readTimeout = 10 * time.Second
	// maxJobs bounds the jobs a listing shows (newest first).
	maxJobs = 200
	// firstOutput is how much of each output stream a job's page renders;
	// the script fetches the rest.
	firstOutput = 256 << 10
	// outputChunk bounds one answer of the output endpoint.
	outputChunk = 64 << 10
	// maxWait bounds the output endpoint's long poll (its wait
	// parameter), below the admin server's write timeout (30 s).
	maxWait = 15 * time.Second
	// outputRecheck is how often a long poll asks the node again.
	outputRecheck = 500 * time.Millisecond
	// auditLimit is the audit events a page shows.
	auditLimit = 100
)

// Header names of the output endpoint's answers.
const (
	// HeaderOutputTotal is the size of the job's output stream so far, in
	// bytes.
	HeaderOutputTotal = "Tether-Output-Total"
	// HeaderOutputEOF is "true" when the job exited and the answer reached
	// the end: no more output will come.
	HeaderOutputEOF = "Tether-Output-EOF"
)

// page is what the layout renders: the page's title, the caller and the
// page's own data.
type page struct {
	Title  string
	Caller caller
	Nav    string
	Data   any
}

// render executes page name with status; a template error (a bug) is
// logged and answered 500.
func (h *Handler) render(w http.ResponseWriter, status int, name string, p any) {
	pg, ok := p.(page)
	if !ok {
		pg = page{Data: p}
	}
	if pg.Title == "" {
		pg.Title = map[string]string{"login": "Sign in"}[name]
	}
	var b bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&b, "layout", pg); err != nil {
		h.log.Error("render", "page", name, "err", err)
		http.Error(w, "console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// fail answers an error page with status and msg.
func (h *Handler) fail(w http.ResponseWriter, c caller, status int, msg string) {
	h.render(w, status, "error", page{Title: http.StatusText(status), Caller: c, Data: errorView{Status: status, Message: msg}})
}

type errorView struct {
	Status  int
	Message string
}

// gate takes one request from the caller's rate budget and checks that
// its policy grants op at all (policy.Store.Holds); on refusal it answers
// (429 or 403) and returns false.
func (h *Handler) gate(w http.ResponseWriter, c caller, op policy.Operation) bool {
	if err := h.cfg.Policy.Allow(c.ID, op); err != nil {
		c.note.refused(err)
		h.fail(w, c, http.StatusTooManyRequests, err.Error())
		return false
	}
	if err := h.cfg.Policy.Holds(c.ID, op); err != nil {
		c.note.refused(err)
		h.fail(w, c, http.StatusForbidden, err.Error())
		return false
	}
	return true
}

// allowed reports whether policy grants op on node and obj, silently (a
// listing leaves out what it may not show; it does not refuse).
func (h *Handler) allowed(c caller, op policy.Operation, node policy.Node, obj policy.Object) bool {
	_, err := h.cfg.Policy.Policy().Decide(c.ID, op, node, obj)
	return err == nil
}

// indexView is the front page's data: the sections and whether the
// caller's policy grants each at all.
type indexView struct {
	Sections []section
}

type section struct {
	Path, Name, Op string
	Granted        bool
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request, c caller) {
	p := h.cfg.Policy.Policy()
	v := indexView{}
	for _, s := range []struct {
		path, name string
		op         policy.Operation
	}{
		{"nodes", "Nodes", policy.OpNodesList},
		{"jobs", "Jobs", policy.OpJobStatus},
		{"sandboxes", "Sandboxes", policy.OpSandboxesList},
		{"audit", "Audit log", policy.OpAdmin},
	} {
		v.Sections = append(v.Sections, section{Path: Prefix + s.path, Name: s.name, Op: s.op.String(), Granted: p.Holds(c.ID, s.op) == nil})
	}
	if !slices.ContainsFunc(v.Sections, func(s section) bool { return s.Granted }) {
		// Nothing to show: refuse as the pages would, with the policy's
		// reason (an identity it does not know, or no read granted).
		err := p.Holds(c.ID, policy.OpNodesList)
		c.note.refused(err)
		h.fail(w, c, http.StatusForbidden, err.Error())
		return
	}
	h.render(w, http.StatusOK, "index", page{Title: "Tether console", Caller: c, Data: v})
}

// nodeRow is one node of the nodes page.
type nodeRow struct {
	protocol.NodeInfo
	LabelList []string // k=v, sorted
	// Stalls is the session's stream-window stall count when the registry
	// reports one (stallsOf), else "—".
	Stalls string
}

// stallsOf returns a node record's stream-window stalls as the nodes page
// shows them: the sum of the struct's (or pointed-to struct's) exported
// integer fields whose name contains "Stall", or "—" when it has none
// (per-session flow-control figures are being added to
// protocol.NodeInfo; the column shows them once they are, without a change
// here).
func stallsOf(rec any) string {
	v := reflect.Indirect(reflect.ValueOf(rec))
	if v.Kind() != reflect.Struct {
		return "—"
	}
	found, sum := false, int64(0)
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if !f.IsExported() || !strings.Contains(f.Name, "Stall") {
			continue
		}
		switch fv := v.Field(i); fv.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			found, sum = true, sum+fv.Int()
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			found, sum = true, sum+int64(fv.Uint())
		}
	}
	if !found {
		return "—"
	}
	return strconv.FormatInt(sum, 10)
}

func (h *Handler) nodes(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.gate(w, c, policy.OpNodesList) {
		return
	}
	var rows []nodeRow
	for _, n := range h.cfg.Fleet.FleetNodes(protocol.Selector{}) {
		if !h.allowed(c, policy.OpNodesList, policy.Node{ID: n.ID, Labels: n.Labels}, policy.Object{}) {
			continue
		}
		rows = append(rows, nodeRow{NodeInfo: n, LabelList: labelList(n.Labels), Stalls: stallsOf(&n)})
	}
	h.render(w, http.StatusOK, "nodes", page{Title: "Nodes", Nav: "nodes", Caller: c, Data: rows})
}

func labelList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// jobsView is the jobs page's data.
type jobsView struct {
	NoStore         bool
	Node, State     string
	Running, Recent []*jobstore.Record
	More            bool
}

// visibleJob reports whether the caller may see rec: the check
// tether.v1.job.list makes (jobstore.VisibleTo: job.status on every node
// of it, with its owner; a job with no nodes its submitter's and admins'
// only).
func (h *Handler) visibleJob(c caller, rec *jobstore.Record) bool {
	return jobstore.VisibleTo(h.cfg.Policy.Policy(), c.ID, rec, h.cfg.Fleet.JobPolicyNodes(rec.Nodes))
}

func (h *Handler) jobs(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.gate(w, c, policy.OpJobStatus) {
		return
	}
	v := jobsView{Node: r.FormValue("node"), State: r.FormValue("state")}
	if h.cfg.Jobs == nil {
		v.NoStore = true
		h.render(w, http.StatusOK, "jobs", page{Title: "Jobs", Nav: "jobs", Caller: c, Data: v})
		return
	}
	q := protocol.JobListRequest{Node: v.Node, State: protocol.JobState(v.State)}
	if e := q.Validate(); e != nil {
		h.fail(w, c, http.StatusBadRequest, e.Message)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	js, err := h.cfg.Jobs.List(ctx, jobstore.Filter{Node: q.Node, State: q.State}, func(rec *jobstore.Record) bool { return h.visibleJob(c, rec) }, maxJobs+1)
	if err != nil {
		h.fail(w, c, http.StatusServiceUnavailable, err.Error())
		return
	}
	if len(js) > maxJobs {
		js, v.More = js[:maxJobs], true
	}
	for _, j := range js {
		rec := j.Record
		if rec.State.Terminal() {
			v.Recent = append(v.Recent, &rec)
		} else {
			v.Running = append(v.Running, &rec)
		}
	}
	h.render(w, http.StatusOK, "jobs", page{Title: "Jobs", Nav: "jobs", Caller: c, Data: v})
}

// jobView is a job's page data.
type jobView struct {
	Job     *jobstore.Record
	Outputs []outputView
	// NoLogs says the caller may see the job but not its output.
	NoLogs bool
}

// outputView is one node's output stream of a detached job, as far as
// the page rendered it; Src is the endpoint the script polls from Offset.
type outputView struct {
	Node, Stream string
	Text         string
	Offset       int64
	EOF          bool
	Src          string
	Error        string
}

// lookupJob returns job id if the caller may see it (job.status), else
// answers 404 (a job the caller may not see does not exist for it, as in
// tether.v1.job.get) and returns nil.
func (h *Handler) lookupJob(ctx context.Context, w http.ResponseWriter, c caller, id string) *jobstore.Record {
	if h.cfg.Jobs == nil {
		h.fail(w, c, http.StatusNotFound, "this coordinator runs without a job store")
		return nil
	}
	if err := protocol.ValidJobID(id); err != nil {
		h.fail(w, c, http.StatusBadRequest, err.Error())
		return nil
	}
	j, err := h.cfg.Jobs.Get(ctx, id)
	switch {
	case errors.Is(err, jobstore.ErrNotFound):
		h.fail(w, c, http.StatusNotFound, "no job "+id)
		return nil
	case err != nil:
		h.fail(w, c, http.StatusServiceUnavailable, err.Error())
		return nil
	}
	rec := j.Record
	c.note.nodes = rec.Nodes
	if !h.visibleJob(c, &rec) {
		c.note.reason = policy.ReasonNoRule.String() // answered as not found
		h.fail(w, c, http.StatusNotFound, "no job "+id)
		return nil
	}
	return &rec
}

// mayReadLogs reports whether the caller may read job rec's output on
// node (job.logs with the job's owner).
func (h *Handler) mayReadLogs(c caller, rec *jobstore.Record, node string) bool {
	n := h.cfg.Fleet.JobPolicyNodes([]string{node})[0]
	return h.allowed(c, policy.OpJobLogs, n, policy.Object{Owner: rec.Owner})
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.gate(w, c, policy.OpJobStatus) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	id := r.PathValue("id")
	c.note.job = id
	rec := h.lookupJob(ctx, w, c, id)
	if rec == nil {
		return
	}
	v := jobView{Job: rec}
	if rec.Detached {
		for _, node := range rec.Nodes {
			if !h.mayReadLogs(c, rec, node) {
				v.NoLogs = true
				continue
			}
			for _, stream := range []string{protocol.ReplyStdout, protocol.ReplyStderr} {
				ov := outputView{Node: node, Stream: stream, Src: Prefix + "jobs/" + id + "/output/" + node + "/" + stream}
				data, end, err := h.cfg.Fleet.JobOutput(ctx, node, id, stream, 0, firstOutput)
				if err != nil {
					ov.Error, ov.EOF = err.Error(), true
				} else {
					ov.Text, ov.Offset = string(data), int64(len(data))
					ov.EOF = end.EOF && ov.Offset >= end.Total
				}
				v.Outputs = append(v.Outputs, ov)
			}
		}
	}
	h.render(w, http.StatusOK, "job", page{Title: "Job " + id, Nav: "jobs", Caller: c, Data: v})
}

// output answers one chunk of a detached job's output stream, from the
// query's offset, as text/plain, with HeaderOutputTotal and
// HeaderOutputEOF. It is what the job page's script polls.
func (h *Handler) output(w http.ResponseWriter, r *http.Request, c caller) {
	id, node, stream := r.PathValue("id"), r.PathValue("node"), r.PathValue("stream")
	c.note.job, c.note.nodes = id, []string{node}
	// A poll past the start continues a read already recorded.
	c.note.skip = r.FormValue("offset") != "0"
	if err := h.cfg.Policy.Allow(c.ID, policy.OpJobLogs); err != nil {
		c.note.refused(err)
		c.note.skip = false
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	if err := h.cfg.Policy.Holds(c.ID, policy.OpJobLogs); err != nil {
		c.note.refused(err)
		c.note.skip = false
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if stream != protocol.ReplyStdout && stream != protocol.ReplyStderr {
		http.Error(w, "stream "+protocol.Clip(stream)+": want stdout or stderr", http.StatusBadRequest)
		return
	}
	offset, err := strconv.ParseInt(r.FormValue("offset"), 10, 64)
	if err != nil || offset < 0 {
		http.Error(w, "offset "+protocol.Clip(r.FormValue("offset"))+": want a byte offset, 0 or more", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout+maxWait)
	defer cancel()
	if h.cfg.Jobs == nil || protocol.ValidJobID(id) != nil {
		http.Error(w, "no job "+protocol.Clip(id), http.StatusNotFound)
		return
	}
	j, err := h.cfg.Jobs.Get(ctx, id)
	if err != nil && !errors.Is(err, jobstore.ErrNotFound) {
		// The store did not answer: the job may exist (as lookupJob says).
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	onNode := err == nil && slices.Contains(j.Nodes, node)
	mayRead := onNode && h.visibleJob(c, &j.Record) && h.mayReadLogs(c, &j.Record, node)
	if onNode && !mayRead {
		c.note.reason = policy.ReasonNoRule.String() // answered as not found
		c.note.skip = false
	}
	if !mayRead {
		// Not found, not the job's node, or not the caller's to read: one
		// answer, so that the caller learns nothing of others' jobs.
		http.Error(w, "no job "+protocol.Clip(id)+" on node "+protocol.Clip(node)+" whose output you may read", http.StatusNotFound)
		return
	}
	wait, err := parseWait(r.FormValue("wait"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// A long poll: with wait, an answer that would be empty while the job
	// runs is asked again every outputRecheck until output comes, the job
	// ends, or wait passed; the page's script then asks again at once.
	until := time.Now().Add(wait)
	var data []byte
	var end protocol.JobOutputEnd
	for {
		data, end, err = h.cfg.Fleet.JobOutput(ctx, node, id, stream, offset, outputChunk)
		if err != nil || len(data) > 0 || end.EOF || !time.Now().Add(outputRecheck).Before(until) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(outputRecheck):
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, jobstore.ErrNoSuchJob) {
			status = http.StatusNotFound
		}
		http.Error(w, err.Error(), status)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/plain; charset=utf-8")
	hd.Set(HeaderOutputTotal, strconv.FormatInt(end.Total, 10))
	hd.Set(HeaderOutputEOF, strconv.FormatBool(end.EOF && offset+int64(len(data)) >= end.Total))
	w.Write(data)
}

// parseWait parses the output endpoint's wait parameter: whole seconds,
// 0 to maxWait; empty means 0.
func parseWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || time.Duration(n)*time.Second > maxWait {
		return 0, fmt.Errorf("wait %s: want whole seconds, 0 to %d", protocol.Clip(v), int(maxWait.Seconds()))
	}
	return time.Duration(n) * time.Second, nil
}

// sandboxesView is the ledger page's data: records grouped by run, then
// node; the leases; the reaps (records the reaper is deleting or
// deleted, or failed to).
type sandboxesView struct {
	NoLedger, Loading bool
	AnyScope          bool
	Run, Node         string
	Runs              []runGroup
	Leases            []ledger.Lease
	Reaps             []ledger.Record
}

type runGroup struct {
	Run   string // "" for sandboxes of no run
	Lease *ledger.Lease
	Nodes []nodeGroup
}

type nodeGroup struct {
	Node    string
	Records []ledger.Record
}

func (h *Handler) sandboxes(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.gate(w, c, policy.OpSandboxesList) {
		return
	}
	v := sandboxesView{Run: r.FormValue("run"), Node: r.FormValue("node")}
	if h.cfg.Ledger == nil {
		v.NoLedger = true
		h.render(w, http.StatusOK, "sandboxes", page{Title: "Sandboxes", Nav: "sandboxes", Caller: c, Data: v})
		return
	}
	if !h.cfg.Ledger.Ready() {
		v.Loading = true
	}
	// Scope own (the default) shows the caller's runs and what it created;
	// any shows everything (as tether.v1.sandboxes.list).
	v.AnyScope = h.allowed(c, policy.OpSandboxesList, policy.Node{}, policy.Object{})
	self := c.ID.String()
	f := ledger.Filter{Run: v.Run, Node: v.Node}
	if !v.AnyScope {
		f.OwnedBy = self
	}
	recs := h.cfg.Ledger.List(f)
	leases := map[string]*ledger.Lease{}
	for _, ls := range h.cfg.Ledger.Leases() {
		if !v.AnyScope && ls.OwnedBy != self {
			continue
		}
		if v.Run != "" && ls.Run != v.Run {
			continue
		}
		v.Leases = append(v.Leases, ls)
		leases[ls.Run] = &v.Leases[len(v.Leases)-1]
	}
	byRun := map[string]map[string][]ledger.Record{}
	for _, rec := range recs {
		run := rec.OwnerLease()
		if byRun[run] == nil {
			byRun[run] = map[string][]ledger.Record{}
		}
		byRun[run][rec.Node] = append(byRun[run][rec.Node], rec)
		switch rec.State {
		case ledger.StateDeleting, ledger.StateDeleted, ledger.StateLeaked:
			v.Reaps = append(v.Reaps, rec)
		default:
			if rec.Attempts > 0 {
				v.Reaps = append(v.Reaps, rec)
			}
		}
	}
	for _, run := range sortedKeys(byRun) {
		g := runGroup{Run: run, Lease: leases[run]}
		for _, node := range sortedKeys(byRun[run]) {
			g.Nodes = append(g.Nodes, nodeGroup{Node: node, Records: byRun[run][node]})
		}
		v.Runs = append(v.Runs, g)
	}
	slices.SortFunc(v.Reaps, func(a, b ledger.Record) int { return b.StateSince.Compare(a.StateSince) })
	h.render(w, http.StatusOK, "sandboxes", page{Title: "Sandboxes", Nav: "sandboxes", Caller: c, Data: v})
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// auditView is the audit page's data.
type auditView struct {
	NoAudit                                   bool
	Identity, Node, Operation, Result, Source string
	Events                                    []protocol.AuditEvent
}

func (h *Handler) audit(w http.ResponseWriter, r *http.Request, c caller) {
	if err := h.cfg.Policy.Allow(c.ID, policy.OpAdmin); err != nil {
		c.note.refused(err)
		h.fail(w, c, http.StatusTooManyRequests, err.Error())
		return
	}
	// The audit log is admin's, as tether.v1.audit.query.
	if _, err := h.cfg.Policy.Decide(c.ID, policy.OpAdmin, policy.Node{}, policy.Object{}); err != nil {
		c.note.refused(err)
		h.fail(w, c, http.StatusForbidden, err.Error())
		return
	}
	v := auditView{Identity: r.FormValue("identity"), Node: r.FormValue("node"), Operation: r.FormValue("operation"), Result: r.FormValue("result"), Source: r.FormValue("source")}
	if h.cfg.Audit == nil {
		v.NoAudit = true
		h.render(w, http.StatusOK, "audit", page{Title: "Audit log", Nav: "audit", Caller: c, Data: v})
		return
	}
	q := protocol.AuditQueryRequest{Identity: v.Identity, Node: v.Node, Operation: v.Operation, Result: v.Result, Source: v.Source, Limit: auditLimit}
	if e := q.Validate(); e != nil {
		h.fail(w, c, http.StatusBadRequest, e.Message)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	resp, err := h.cfg.Audit.Query(ctx, q, 0)
	if err != nil {
		h.fail(w, c, http.StatusServiceUnavailable, err.Error())
		return
	}
	v.Events = resp.Events
	h.render(w, http.StatusOK, "audit", page{Title: "Audit log", Nav: "audit", Caller: c, Data: v})
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago":   ago,
	"stamp": stamp,
	"rtt": func(us int64) string {
		if us <= 0 {
			return "—"
		}
		return (time.Duration(us) * time.Microsecond).Round(10 * time.Microsecond).String()
	},
	"bytes": humanBytes,
	"join":  strings.Join,
	"exit": func(p *int) string {
		if p == nil {
			return "—"
		}
		return strconv.Itoa(*p)
	},
}

// ago renders t relative to now ("3s ago"), "—" when zero.
func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + (-d).Round(time.Second).String()
	}
	return d.Round(time.Second).String() + " ago"
}

// stamp renders t in UTC, "—" when zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func humanBytes(n uint64) string {
	if n == 0 {
		return "—"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
