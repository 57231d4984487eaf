package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/protocol"
)

// chunk is how many events a newest-first page reads per consumer (and an
// oldest-first page per fetch).
const chunk = 256

// eventRoom is what a reply's framing may take beyond its events' bytes.
const eventRoom = 1 << 10

// Query returns one page of the events matching q (validated), at most
// q.Limit (default protocol.DefaultAuditLimit) and, JSON-encoded, at most
// maxBytes bytes (0: no bound; the coordinator passes its server's max
// payload), after reading at most MaxScan events. ctx bounds the reads.
func (r *Recorder) Query(ctx context.Context, q protocol.AuditQueryRequest, maxBytes int) (*protocol.AuditQueryResponse, error) {
	if e := q.Validate(); e != nil {
		return nil, e
	}
	if q.Limit == 0 {
		q.Limit = protocol.DefaultAuditLimit
	}
	pg := &page{q: q, resp: &protocol.AuditQueryResponse{Events: []protocol.AuditEvent{}}, room: maxBytes - eventRoom}
	if q.Source != "" {
		var ok bool
		if pg.src, ok = parseSource(q.Source); !ok {
			return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "source %s: want an IP address, or IP:PORT ([IPv6]:PORT)", protocol.Clip(q.Source))
		}
	}
	if maxBytes <= 0 {
		pg.room = -1
	}
	info, err := r.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: stream %s: %w", r.cfg.Stream, err)
	}
	st := info.State
	pg.resp.Last = st.LastSeq
	if st.Msgs == 0 {
		if q.Order == protocol.AuditOldestFirst {
			pg.resp.Next = st.LastSeq + 1
		}
		return pg.resp, nil
	}
	if q.Order == protocol.AuditOldestFirst {
		err = r.forward(ctx, pg, st)
	} else {
		err = r.backward(ctx, pg, st)
	}
	if err != nil {
		return nil, err
	}
	return pg.resp, nil
}

// page is a query page being filled.
type page struct {
	q    protocol.AuditQueryRequest
	resp *protocol.AuditQueryResponse
	room int    // bytes left for events; -1 unbounded
	src  source // q.Source, parsed
}

// source is an AuditEvent.Source or AuditQueryRequest.Source, parsed:
// an IP, and a port when port is true.
type source struct {
	ap   netip.AddrPort
	port bool
}

// parseSource reads "IP" or "IP:PORT" ("[IPv6]:PORT"); an IPv4-mapped
// IPv6 address is taken as its IPv4 one, as listeners name it.
func parseSource(s string) (source, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return source{ap: netip.AddrPortFrom(a.Unmap(), 0)}, true
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return source{}, false
	}
	return source{ap: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), port: true}, true
}

// matches reports whether an event's Source is from the filter's address
// (and port, when the filter names one).
func (f source) matches(evSource string) bool {
	s, ok := parseSource(evSource)
	return ok && s.ap.Addr() == f.ap.Addr() && (!f.port || s.ap.Port() == f.ap.Port())
}

// take looks at the stream message of sequence seq stored at ts: it adds
// the event to the page if it matches. It returns false when the page is
// full and the event was not added (it belongs to the next page).
func (p *page) take(seq uint64, ts time.Time, data []byte) bool {
	if !p.q.Since.IsZero() && ts.Before(p.q.Since) || !p.q.Until.IsZero() && ts.After(p.q.Until) {
		return true
	}
	var ev protocol.AuditEvent
	if json.Unmarshal(data, &ev) != nil || !p.matches(&ev) {
		return true // not an event of ours: only coordinators write here
	}
	ev.Seq = seq
	if p.room >= 0 {
		b, _ := json.Marshal(&ev)
		if len(b)+1 > p.room {
			return false
		}
		p.room -= len(b) + 1
	}
	p.resp.Events = append(p.resp.Events, ev)
	return true
}

func (p *page) full() bool { return len(p.resp.Events) >= p.q.Limit }

func (p *page) matches(ev *protocol.AuditEvent) bool {
	q := &p.q
	switch {
	case q.Identity != "" && q.Identity != ev.Identity && (ev.IdentityKey == "" || q.Identity != identityKind(ev.Identity)+ev.IdentityKey):
		return false
	case q.Node != "" && !slices.Contains(ev.Nodes, q.Node):
		return false
	case q.JobID != "" && q.JobID != ev.JobID:
		return false
	case q.Operation != "" && q.Operation != ev.Operation:
		return false
	case q.Result != "" && q.Result != ev.Result:
		return false
	case q.Source != "" && !p.src.matches(ev.Source):
		return false
	}
	return true
}

// identityKind is the "KIND:" of a KIND:VALUE identity, "" if none.
func identityKind(id string) string {
	for i := 0; i < len(id); i++ {
		if id[i] == ':' {
			return id[:i+1]
		}
	}
	return ""
}

// filter is the subject filter of q's operation and result.
func filter(q protocol.AuditQueryRequest) string {
	op, res := "*", "*"
	if q.Operation != "" {
		op = protocol.AuditToken(q.Operation)
	}
	if q.Result != "" {
		res = protocol.AuditToken(q.Result)
	}
	return protocol.SubjectAuditPrefix + op + "." + res
}

// consumer reads the stream from seq (0: from the first event at or after
// since, or from the start) through q's subject filter.
func (r *Recorder) consumer(ctx context.Context, q protocol.AuditQueryRequest, seq uint64, since time.Time) (jetstream.Consumer, error) {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{filter(q)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 10 * time.Second,
	}
	switch {
	case seq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	case !since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := r.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("audit: read stream %s: %w", r.cfg.Stream, err)
	}
	return c, nil
}

// fetch reads up to n messages of c that are there now, calling f with
// each until it returns false; it reports whether f stopped it and whether
// the stream had nothing more for c.
func fetch(c jetstream.Consumer, n int, f func(seq uint64, ts time.Time, data []byte) bool) (stopped, end bool, err error) {
	b, err := c.FetchNoWait(n)
	if err != nil {
		return false, false, err
	}
	got := 0
	for m := range b.Messages() {
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		got++
		if !f(md.Sequence.Stream, md.Timestamp, m.Data()) {
			// Drain the rest of the batch: FetchNoWait's messages are
			// already on their way.
			for range b.Messages() {
			}
			return true, false, nil
		}
		if md.NumPending == 0 {
			end = true
		}
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return false, false, err
	}
	return false, end || got == 0, nil
}

// forward fills an oldest-first page: from q.Cursor, or Since.
func (r *Recorder) forward(ctx context.Context, pg *page, st jetstream.StreamState) error {
	q := pg.q
	next := q.Cursor
	if next == 0 && q.Since.IsZero() {
		next = st.FirstSeq
	}
	c, err := r.consumer(ctx, q, q.Cursor, q.Since)
	if err != nil {
		return err
	}
	for pg.resp.Scanned < MaxScan && !pg.full() {
		stopped, end, err := fetch(c, min(chunk, MaxScan-pg.resp.Scanned), func(seq uint64, ts time.Time, data []byte) bool {
			if !q.Until.IsZero() && ts.After(q.Until) {
				return false
			}
			pg.resp.Scanned++
			if !pg.take(seq, ts, data) {
				return false
			}
			next = seq + 1
			return !pg.full() && pg.resp.Scanned < MaxScan
		})
		if err != nil {
			return fmt.Errorf("audit: read stream %s: %w", r.cfg.Stream, err)
		}
		if stopped {
			break
		}
		if end {
			// Every event up to the last one when the read began was
			// looked at: a follower goes on after it.
			next = max(next, st.LastSeq+1)
			break
		}
	}
	pg.resp.Next = next
	return nil
}

// backward fills a newest-first page: below q.Cursor, or from the newest
// event at or before Until, down to Since; a chunk at a time, each read
// forward and taken in reverse.
func (r *Recorder) backward(ctx context.Context, pg *page, st jetstream.StreamState) error {
	q := pg.q
	hi := st.LastSeq
	if q.Cursor > 0 {
		hi = min(hi, q.Cursor-1)
	}
	if !q.Until.IsZero() {
		// The first event after Until bounds the page from above.
		if s, ok, err := r.firstAt(ctx, q.Until.Add(time.Nanosecond)); err != nil {
			return err
		} else if ok && s > 0 {
			hi = min(hi, s-1)
		}
	}
	lo := st.FirstSeq
	if !q.Since.IsZero() {
		s, ok, err := r.firstAt(ctx, q.Since)
		if err != nil {
			return err
		}
		if !ok {
			return nil // nothing since
		}
		lo = max(lo, s)
	}
	type msg struct {
		seq  uint64
		ts   time.Time
		data []byte
	}
	for hi >= lo && hi > 0 {
		from := lo
		if hi-lo >= chunk {
			from = hi - chunk + 1
		}
		c, err := r.consumer(ctx, q, from, time.Time{})
		if err != nil {
			return err
		}
		var got []msg
		for {
			stopped, end, err := fetch(c, chunk, func(seq uint64, ts time.Time, data []byte) bool {
				if seq > hi {
					return false
				}
				got = append(got, msg{seq, ts, data})
				return true
			})
			if err != nil {
				return fmt.Errorf("audit: read stream %s: %w", r.cfg.Stream, err)
			}
			if stopped || end {
				break
			}
		}
		for i := len(got) - 1; i >= 0; i-- {
			m := got[i]
			pg.resp.Scanned++
			if !pg.take(m.seq, m.ts, m.data) {
				pg.resp.Next = m.seq + 1
				return nil
			}
			if pg.full() || pg.resp.Scanned >= MaxScan {
				pg.resp.Next = m.seq
				if m.seq <= lo {
					pg.resp.Next = 0
				}
				return nil
			}
		}
		if from == 0 {
			break
		}
		hi = from - 1
	}
	return nil
}

// firstAt returns the sequence of the first event stored at or after t,
// and false when there is none.
func (r *Recorder) firstAt(ctx context.Context, t time.Time) (uint64, bool, error) {
	c, err := r.consumer(ctx, protocol.AuditQueryRequest{}, 0, t)
	if err != nil {
		return 0, false, err
	}
	var seq uint64
	_, _, err = fetch(c, 1, func(s uint64, _ time.Time, _ []byte) bool { seq = s; return true })
	if err != nil {
		return 0, false, fmt.Errorf("audit: read stream %s: %w", r.cfg.Stream, err)
	}
	return seq, seq > 0, nil
}
