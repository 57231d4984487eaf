package tunnel

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Flow-control telemetry (issue 12 item 6): how often a session's streams
// ran out of the peer's window and for how long, how many bytes the session
// holds for its connection, and the round trips of its pings. yamux exports
// none of this and is not forked, so the session watches the frames it
// writes and reads beneath yamux, where the coalescing writer (send loop)
// and the readiness watch (receive loop) already parse every frame header:
//
//   - Window stalls. yamux lets a stream send at most its send window: 256
//     KiB at the open (the spec's initial window), plus every window update
//     the peer sent for it, less every data byte sent on it. A Write with
//     more than that sends what the window allows and then waits for the
//     peer's next window update. The session keeps the same arithmetic per
//     stream from the frames (data lengths it writes, window-update deltas
//     it reads): a data frame that takes the window to zero starts a stall,
//     the next window update for that stream ends it. This is the peer's
//     reader being slower than the writer (a full window in flight), the
//     way TCP's zero-window / rwnd-limited time is; the writer's own pace,
//     the connection's and the scheduler's do not count. A stream's window
//     is 256 KiB until the peer's acknowledgement of its open grants the
//     rest, so a writer that sends more than that within the first round
//     trip counts one short stall: a real wait, the price of a new stream.
//   - Bytes queued for send: yamux's Write does not return until its frame
//     was written to the connection (the send loop hands it the error), so
//     a session holds at most one frame per writing stream. The gauge is
//     the body bytes of the data frame the send loop is writing into the
//     connection and that the connection has not taken yet: above zero while
//     the link (TLS, the socket's send buffer) cannot keep up, zero when
//     idle. Frames still waiting in yamux's own send queue are not visible
//     from outside yamux and are not counted.
//   - RTT: every Session.Ping records its round trip (Session.FlowStats);
//     the agent's heartbeat pings are these, and the coordinator takes the
//     agent's RTT from its heartbeats.
//
// Cost: a stream's arithmetic is three atomics, touched by the send loop
// (sent) and the receive loop (granted, stall end) only; the stream table is
// copy on write, replaced under a mutex when a stream opens or closes and
// read with one atomic load per frame, so no lock and no allocation is taken
// per frame (about 30 ns of CPU for a data frame written and a window
// update read, BenchmarkFlowFrame). The clock is read only when a stall
// starts or ends. Tracking is
// on only for sessions whose Config.Flow is set (the agents' tunnels at both
// ends); an idle tracked session holds one small table for its control
// stream and no goroutine.

// initialStreamWindow is every yamux stream's send window at its open,
// before the peer's first window update (hashicorp/yamux spec.md).
const initialStreamWindow = 256 << 10

// maxFlowStreams bounds the streams one session tracks: the table is copied
// on every open and close, so a session with more concurrent streams than
// this leaves the extra ones untracked rather than copy ever larger tables.
const maxFlowStreams = 1024

// yamux frame flags the flow watch needs, besides FIN and RST (watch.go).
const yamuxFlagSYN = 0x1

// FlowCounters adds up the flow-control events of every session whose
// Config.Flow points to it: one for all the agents' tunnels of a
// coordinator, one for an agent's own. Its counts only grow (a closed
// session's stalls stay counted); QueuedBytes is the sum over the live
// sessions. The zero value is ready; it is safe for concurrent use.
type FlowCounters struct {
	stalls     atomic.Uint64
	stallNanos atomic.Int64
	queued     atomic.Int64
}

// Stalls reports how many times a stream of these sessions ran out of its
// peer's window (a stall in progress is counted).
func (f *FlowCounters) Stalls() uint64 { return f.stalls.Load() }

// StallTime reports the total duration of the ended stalls of these
// sessions; a stall is added when the window update that ends it arrives,
// or when its stream or session ends.
func (f *FlowCounters) StallTime() time.Duration { return time.Duration(f.stallNanos.Load()) }

// QueuedBytes reports the bytes these sessions are writing into their
// connections and that the connections have not taken yet (see
// FlowStats.QueuedBytes).
func (f *FlowCounters) QueuedBytes() int64 { return f.queued.Load() }

// FlowStats is a session's flow-control telemetry, as Session.FlowStats
// reports it. All zero for a session without Config.Flow, save RTT.
type FlowStats struct {
	// Stalls counts the times one of the session's streams ran out of the
	// peer's window, since the session started, a stall in progress
	// included.
	Stalls uint64
	// StallTime is the total time the session's streams spent out of
	// window, a stall in progress counted up to now.
	StallTime time.Duration
	// QueuedBytes is the body bytes of the data frame yamux's send loop is
	// writing into the connection and that the connection has not taken
	// yet: zero while idle, above zero while the link is slower than the
	// writers.
	QueuedBytes int64
	// RTT is the round trip of the session's last answered Ping; zero
	// before one.
	RTT time.Duration
	// Pings counts the session's answered Pings.
	Pings uint64
}

// flowState is one session's telemetry. It lives inside the session's
// watchConn (no allocation of its own); send is called by the send loop
// only, recv by the receive loop only.
type flowState struct {
	agg   *FlowCounters // Config.Flow; nil: streams untracked
	epoch time.Time     // monotonic origin of stall starts

	stalls     atomic.Uint64
	stallNanos atomic.Int64 // ended stalls
	queued     atomic.Int64
	rttNanos   atomic.Int64
	pings      atomic.Uint64

	mu  sync.Mutex // serializes table replacements (stream open and close)
	tab atomic.Pointer[flowTable]
}

// flowTable is an immutable snapshot of the tracked streams, ids sorted.
type flowTable struct {
	ids  []uint32
	ents []*streamFlow
}

// streamFlow is one stream's window arithmetic: window = initial + granted
// - sent.
type streamFlow struct {
	sent    atomic.Uint64 // data bytes written (send loop)
	granted atomic.Uint64 // window-update deltas read (receive loop)
	// stallStart is the stall's start in nanoseconds since epoch, plus 1;
	// 0 while the stream has window.
	stallStart atomic.Int64
	finSent    atomic.Bool
	finRecv    atomic.Bool
}

func (f *flowState) lookup(id uint32) *streamFlow {
	t := f.tab.Load()
	if t == nil {
		return nil
	}
	if i, ok := slices.BinarySearch(t.ids, id); ok {
		return t.ents[i]
	}
	return nil
}

// add starts tracking stream id (its SYN was written or read).
func (f *flowState) add(id uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tab.Load()
	var ids []uint32
	var ents []*streamFlow
	if t != nil {
		ids, ents = t.ids, t.ents
	}
	i, ok := slices.BinarySearch(ids, id)
	if ok || len(ids) >= maxFlowStreams {
		return
	}
	n := &flowTable{ids: make([]uint32, 0, len(ids)+1), ents: make([]*streamFlow, 0, len(ids)+1)}
	n.ids = append(append(append(n.ids, ids[:i]...), id), ids[i:]...)
	n.ents = append(append(append(n.ents, ents[:i]...), &streamFlow{}), ents[i:]...)
	f.tab.Store(n)
}

// remove stops tracking stream id (reset, or closed both ways), ending its
// stall if one is in progress.
func (f *flowState) remove(id uint32) {
	if f.agg == nil {
		return
	}
	f.mu.Lock()
	t := f.tab.Load()
	if t == nil {
		f.mu.Unlock()
		return
	}
	i, ok := slices.BinarySearch(t.ids, id)
	if !ok {
		f.mu.Unlock()
		return
	}
	e := t.ents[i]
	if len(t.ids) == 1 {
		f.tab.Store(nil)
	} else {
		f.tab.Store(&flowTable{ids: slices.Delete(slices.Clone(t.ids), i, i+1), ents: slices.Delete(slices.Clone(t.ents), i, i+1)})
	}
	f.mu.Unlock()
	f.endStall(e)
}

// endStall ends e's stall, if one is in progress, and adds its duration.
func (f *flowState) endStall(e *streamFlow) {
	if e.stallStart.Load() == 0 {
		return // the common case, without a read-modify-write
	}
	if st := e.stallStart.Swap(0); st != 0 {
		d := int64(time.Since(f.epoch)) - (st - 1)
		f.stallNanos.Add(d)
		f.agg.stallNanos.Add(d)
	}
}

// closeAll ends every stall in progress and the frame in the connection's
// hands: the session's connection closed.
func (f *flowState) closeAll() {
	if f.agg == nil {
		return
	}
	f.queueEnd()
	if t := f.tab.Load(); t != nil {
		for _, e := range t.ents {
			f.endStall(e)
		}
	}
}

// send notes a frame header the send loop writes. The caller checked
// that f tracks streams (agg is set).
func (f *flowState) send(hdr []byte) {
	typ, flags, id, length := parseHeader(hdr)
	if (typ != yamuxTypeData && typ != yamuxTypeWindowUpdate) || id == 0 {
		return
	}
	if flags&yamuxFlagSYN != 0 {
		f.add(id)
	}
	if typ == yamuxTypeData && length > 0 {
		if e := f.lookup(id); e != nil {
			sent := e.sent.Add(uint64(length))
			g := e.granted.Load()
			if sent >= initialStreamWindow+g {
				f.startStall(e, g)
			}
		}
	}
	f.flags(id, flags, true)
}

// startStall starts e's stall: the frame just written used up its window,
// as it stood with g granted.
func (f *flowState) startStall(e *streamFlow, g uint64) {
	now := int64(time.Since(f.epoch)) + 1
	if !e.stallStart.CompareAndSwap(0, now) {
		return // already stalled (the arithmetic went past zero)
	}
	f.stalls.Add(1)
	f.agg.stalls.Add(1)
	// A window update read between the load of granted and the store
	// above found no stall to end: undo it. If the receive loop ended it
	// meanwhile (the swap below fails), it was a stall of no time.
	if e.granted.Load() != g {
		e.stallStart.CompareAndSwap(now, 0)
	}
}

// recv notes a frame header the receive loop read. The caller checked
// that f tracks streams (agg is set).
func (f *flowState) recv(typ byte, flags uint16, id, length uint32) {
	if (typ != yamuxTypeData && typ != yamuxTypeWindowUpdate) || id == 0 {
		return
	}
	if flags&yamuxFlagSYN != 0 {
		f.add(id)
	}
	if typ == yamuxTypeWindowUpdate && length > 0 {
		if e := f.lookup(id); e != nil {
			e.granted.Add(uint64(length))
			f.endStall(e)
		}
	}
	f.flags(id, flags, false)
}

// flags handles a frame's FIN and RST: a stream is forgotten once reset or
// closed both ways.
func (f *flowState) flags(id uint32, flags uint16, sent bool) {
	if flags&(yamuxFlagFIN|yamuxFlagRST) == 0 {
		return
	}
	if flags&yamuxFlagRST != 0 {
		f.remove(id)
		return
	}
	e := f.lookup(id)
	if e == nil {
		return
	}
	var other bool
	if sent {
		e.finSent.Store(true)
		other = e.finRecv.Load()
	} else {
		e.finRecv.Store(true)
		other = e.finSent.Load()
	}
	if other {
		f.remove(id)
	}
}

// snapshot reports the session's telemetry, stalls in progress included.
func (f *flowState) snapshot() FlowStats {
	s := FlowStats{
		Stalls:      f.stalls.Load(),
		StallTime:   time.Duration(f.stallNanos.Load()),
		QueuedBytes: f.queued.Load(),
		RTT:         time.Duration(f.rttNanos.Load()),
		Pings:       f.pings.Load(),
	}
	if t := f.tab.Load(); t != nil {
		now := int64(time.Since(f.epoch))
		for _, e := range t.ents {
			if st := e.stallStart.Load(); st != 0 {
				s.StallTime += time.Duration(max(0, now-(st-1)))
			}
		}
	}
	return s
}

// queueStart notes that the send loop hands the connection a data frame
// of n body bytes; queueEnd that the connection took it (or failed). The
// send loop writes one frame at a time, so the session holds at most one.
// The caller checked that f tracks streams (agg is set).
func (f *flowState) queueStart(n int64) {
	// The shared gauge first: a queueEnd from the closing goroutine
	// between the two steps then takes off only what was added, so the
	// gauge never dips below zero.
	f.agg.queued.Add(n)
	f.queued.Store(n)
}

// queueEnd ends the frame queueStart began. It is also called when the
// connection closes, from another goroutine: the swap makes sure only one
// of the two takes the frame off the shared gauge.
func (f *flowState) queueEnd() {
	if n := f.queued.Swap(0); n != 0 {
		f.agg.queued.Add(-n)
	}
}

// parseHeader splits a yamux frame header (hashicorp/yamux spec.md).
func parseHeader(h []byte) (typ byte, flags uint16, id, length uint32) {
	_ = h[11]
	return h[1], uint16(h[2])<<8 | uint16(h[3]),
		uint32(h[4])<<24 | uint32(h[5])<<16 | uint32(h[6])<<8 | uint32(h[7]),
		uint32(h[8])<<24 | uint32(h[9])<<16 | uint32(h[10])<<8 | uint32(h[11])
}

// FlowStats reports the session's flow-control telemetry. It is cheap (a
// few atomic loads and a walk over the open streams) and safe to call
// from any goroutine.
func (s *Session) FlowStats() FlowStats { return s.wc.flow.snapshot() }
