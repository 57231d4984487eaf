package console

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodRounds is more logouts than the old global revocation set held
// (1<<16), which then replaced the key and signed everyone out.
const floodRounds = 1<<16 + 8

// One identity's login/logout flood signs nobody else out, and none of
// the sessions it ended passes again while unexpired, also while other
// goroutines validate them during the flood's cutoffs (review: the set was
// cleared under one lock and the key replaced under another, and in
// between a revoked cookie passed; and any token holder could force that
// rotation).
func TestLogoutFloodSignsOutOnlyTheFlooder(t *testing.T) {
	e := newEnv(t)
	// Long enough that none of the flood's sessions (one a second)
	// expires during it: the worst case for the revocation state.
	e.h.cfg.SessionTTL = 24 * time.Hour
	tick := func() {
		e.nowMu.Lock()
		e.now = e.now.Add(time.Second)
		e.nowMu.Unlock()
	}
	bob := e.h.sealSession("admin")
	revoked := e.h.sealSession("alice")
	e.h.endSession(revoked)
	tick()

	var passed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, ok := e.h.openSession(revoked); ok {
					passed.Add(1)
				}
			}
		})
	}
	var ended []string
	for i := range floodRounds {
		v := e.h.sealSession("alice")
		e.h.endSession(v)
		if i%64 == 0 {
			ended = append(ended, v)
		}
		tick()
	}
	close(stop)
	wg.Wait()

	if n := passed.Load(); n > 0 {
		t.Errorf("a logged-out cookie passed %d times during the flood", n)
	}
	if _, ok := e.h.openSession(bob); !ok {
		t.Errorf("another identity's session was signed out by alice's login/logout flood")
	}
	for _, v := range append(ended, revoked) {
		if _, ok := e.h.openSession(v); ok {
			t.Fatalf("logged-out cookie %s passes again", v)
		}
	}
	if r := e.h.sess.byName["alice"]; r == nil || len(r.sids) > maxRevokedPerName {
		t.Errorf("alice's remembered revocations: %v, want at most %d", r, maxRevokedPerName)
	}
	if v := e.h.sealSession("alice"); !func() bool { _, ok := e.h.openSession(v); return ok }() {
		t.Errorf("a new session of the flooder after its flood is refused")
	}
}
