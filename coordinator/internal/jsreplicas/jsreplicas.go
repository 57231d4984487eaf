package jsreplicas

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Max is the replica count Create tries first: three copies survive the
// loss of any one server and keep a quorum.
const Max = 3

// attemptTimeout bounds one create call: the first at firstAttempt, each
// next one twice the last, up to attemptTimeout. A call that times out is
// followed by a look whether the store exists (Store.Exists) and, if not,
// made again (after a jittered pause, see retryPause) while ctx lasts.
// Why: when several coordinators create the same replicated stream at
// once on a fresh cluster, nats-server (2.15.2) often leaves every one of
// the concurrent requests unanswered although the stream gets created
// within a second (each identical request is proposed to the meta group
// again; TestClusterStartTogether sees it for most stores when three
// creators open them in step); the same request made again alone, or a
// look at the stream's info, is answered at once. Creators that found a
// store together go on to the next together, so without the look each
// store cost a whole unanswered call. A create or update of a stream to
// the configuration it has is a no-op, so repeating one is safe.
var attemptTimeout = 4 * time.Second

// firstAttempt bounds the first create call of a store (see
// attemptTimeout).
const firstAttempt = time.Second

// Store names a store for Create and says how to find it.
type Store struct {
	// Name is the store in the operator's terms, for logs ("job store
	// bucket tether_jobs").
	Name string
	// Replicas forces the replica count (1 to 5); 0 means min(Max,
	// cluster size), found by trial.
	Replicas int
	// Log receives a warning for each create call that went unanswered
	// or was refused as unavailable (the store, the replica count, the
	// attempt and how long it has waited). Nil discards them.
	Log *slog.Logger
	// Replicas of the store as it exists, if it does (the stream's
	// info; exists false when there is none). Optional: when set, a
	// create call that went unanswered is followed by this look, and a
	// store found with the replica count asked for counts as created (the
	// create was applied; its answer is what got lost). The call gets a
	// bounded context.
	Exists func(ctx context.Context) (replicas int, exists bool, err error)
}

// Create calls create with a replica count and returns the count that
// succeeded. st.Replicas > 0 forces that count; 0 tries Max, then each
// smaller count down to 1, moving on only while create's error says the
// servers cannot place that many replicas (TooFewPeers; a cluster's
// refusal, 10005 or 10023, is first asked again once after a pause, as a
// peer of a cluster that just started may not be current yet), and only
// when st.Exists does not find the store with at least that many already
// (made meanwhile by another creator: it is kept, and its count returned;
// the same look follows a smaller count's create refused because the name
// is in use, 10058, which is that creator's store landing between the look
// and the create). Each call gets a
// context bounded by ctx and by a few seconds (1, then 2, then 4: see
// attemptTimeout); a call that ran out of them is followed by a look at
// the store (st.Exists, if set: one that exists with the count asked for
// counts as created); a call that ran out of time, or was answered
// Unavailable, is made again while ctx lasts, after a
// jittered pause that grows with the attempts (so that coordinators that
// started together stop asking in lockstep), and is logged (st.Log). Any
// other error, or the error for the last count, is returned wrapped with
// the count tried. st.Replicas must be 0 to 5. It blocks until a call
// succeeds or ctx ends.
func Create(ctx context.Context, st Store, create func(ctx context.Context, replicas int) error) (int, error) {
	want := st.Replicas
	if want < 0 || want > 5 {
		return 0, fmt.Errorf("replicas %d: want 0 (auto) to 5", want)
	}
	if st.Log == nil {
		st.Log = slog.New(slog.DiscardHandler)
	}
	tries := []int{want}
	if want == 0 {
		tries = tries[:0]
		for r := Max; r >= 1; r-- {
			tries = append(tries, r)
		}
	}
	for i, r := range tries {
		err := attempt(ctx, &st, r, create)
		for n := 1; n <= placementRetries && r > 1 && placementRefused(err); n++ {
			// A cluster that just started refuses placement while a peer
			// is not yet current; asked again a moment later it places
			// them. Stepping down at once would give this creator fewer
			// replicas than the others starting with it.
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("replicas %d: %w", r, err)
			case <-time.After(retryPause(n)):
			}
			err = attempt(ctx, &st, r, create)
		}
		if err == nil {
			return r, nil
		}
		if i > 0 && NameInUse(err) && st.Exists != nil {
			// Stepped down while another creator placed the store with
			// more replicas: its create landed between this one's look and
			// this one's create, so the name is taken with another count.
			lctx, cancel := context.WithTimeout(ctx, existsTimeout)
			have, ok, lerr := st.Exists(lctx)
			cancel()
			if lerr == nil && ok && have >= r {
				return have, nil
			}
		}
		if !TooFewPeers(err) || r == tries[len(tries)-1] {
			return 0, fmt.Errorf("replicas %d: %w", r, err)
		}
		// Before asking for fewer: another coordinator creating the store
		// at once may have placed r replicas while this one's request was
		// refused (a peer not yet current on a fresh cluster); a create
		// or update with fewer would scale that store down.
		if st.Exists != nil {
			lctx, cancel := context.WithTimeout(ctx, existsTimeout)
			have, ok, lerr := st.Exists(lctx)
			cancel()
			if lerr == nil && ok && have >= r {
				return have, nil
			}
		}
	}
	return 0, errors.New("replicas: no count to try") // not reached: tries is never empty
}

// existsTimeout bounds one Store.Exists call.
const existsTimeout = 2 * time.Second

// attempt calls create for r until it answers within attemptTimeout, with
// anything but Unavailable, or ctx ends; after each unanswered call it
// looks whether the store exists with r replicas (st.Exists).
func attempt(ctx context.Context, st *Store, r int, create func(ctx context.Context, replicas int) error) error {
	start := time.Now()
	bound := min(firstAttempt, attemptTimeout)
	for n := 1; ; n, bound = n+1, min(2*bound, attemptTimeout) {
		actx, cancel := context.WithTimeout(ctx, bound)
		err := create(actx, r)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil || !(timedOut || Unavailable(err)) {
			return err
		}
		why := "unanswered within " + bound.String()
		if !timedOut {
			why = err.Error()
		}
		if timedOut && st.Exists != nil {
			ectx, cancel := context.WithTimeout(ctx, existsTimeout)
			have, ok, eerr := st.Exists(ectx)
			cancel()
			if eerr == nil && ok && have == r {
				st.Log.Info("JetStream store found created although its create went unanswered", "store", st.Name, "replicas", r, "attempt", n, "waited", time.Since(start).Round(time.Millisecond))
				return nil
			}
		}
		st.Log.Warn("still waiting for JetStream to create a store; asking again", "store", st.Name, "replicas", r, "attempt", n, "waited", time.Since(start).Round(time.Millisecond), "why", why)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryPause(n)):
		}
	}
}

// retryPause is the pause before attempt n+1: random in [100 ms, 100 ms
// + 500 ms·n), at most 3 s, so that creators that timed out together do
// not ask again together.
func retryPause(n int) time.Duration {
	spread := min(500*time.Millisecond*time.Duration(n), 3*time.Second)
	return 100*time.Millisecond + rand.N(spread)
}

// Unavailable reports whether err says the JetStream servers cannot answer
// yet (10008, "JetStream system temporarily unavailable"): what a cluster
// that was just restarted answers while it elects its meta and stream
// leaders. Like a timed-out call, such a call is made again. (No
// responders is not among them: it is what a server without JetStream
// answers, which waiting does not mend.)
func Unavailable(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == 10008
}

// placementRetries is how many times a count refused for want of peers
// (placementRefused) is asked for again before Create steps down.
const placementRetries = 1

// placementRefused reports whether err is a cluster's refusal to place
// that many replicas now (10005 no suitable peers, 10023 insufficient
// resources), which a peer catching up can end; not 10074 (a server
// outside any cluster), which is final.
func placementRefused(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && (ae.ErrorCode == 10005 || ae.ErrorCode == 10023)
}

// NameInUse reports whether err says a stream of that name exists with
// another configuration (10058, "stream name already in use").
func NameInUse(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamNameInUse
}

// TooFewPeers reports whether err says the JetStream servers cannot place
// that many replicas: a server that is not in a cluster, or a cluster with
// fewer peers up than asked for.
func TooFewPeers(err error) bool {
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode {
		case 10074, // replicas > 1 not supported in non-clustered mode
			10005, // no suitable peers for placement
			10023: // insufficient resources
			return true
		}
	}
	// Older servers and the KV layer's own wrapping may lose the code.
	m := err.Error()
	return strings.Contains(m, "replicas > 1 not supported") ||
		strings.Contains(m, "no suitable peers") ||
		strings.Contains(m, "insufficient resources")
}

// BucketExists is a Store.Exists for the KV bucket named bucket on js: it
// reads the bucket's stream and, when the bucket exists, binds *kv to it
// (as the create would have).
func BucketExists(js jetstream.JetStream, bucket string, kv *jetstream.KeyValue) func(context.Context) (int, bool, error) {
	return func(ctx context.Context) (int, bool, error) {
		b, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, err
		}
		st, err := b.Status(ctx)
		if err != nil {
			return 0, false, err
		}
		bs, ok := st.(*jetstream.KeyValueBucketStatus)
		if !ok || bs.StreamInfo() == nil {
			return 0, false, fmt.Errorf("bucket %s: status without stream info", bucket)
		}
		*kv = b
		return bs.StreamInfo().Config.Replicas, true, nil
	}
}

// StreamExists is a Store.Exists for the stream named name on js: when it
// exists, *st is bound to it (as the create would have).
func StreamExists(js jetstream.JetStream, name string, st *jetstream.Stream) func(context.Context) (int, bool, error) {
	return func(ctx context.Context) (int, bool, error) {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, err
		}
		*st = s
		return s.CachedInfo().Config.Replicas, true, nil
	}
}
