package jsreplicas

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Max is the replica count Create tries first: three copies survive the
// loss of any one server and keep a quorum.
const Max = 3

// attemptTimeout bounds one create call; a call that times out is made
// again (after a jittered pause) while ctx lasts. Why: when several
// coordinators create the same replicated stream at once on a fresh
// cluster, nats-server (2.15) can leave every one of the concurrent
// requests unanswered although the stream gets created; the same request
// made again is answered at once. A create or update of a stream to the
// configuration it has is a no-op, so repeating one is safe.
const attemptTimeout = 4 * time.Second

// Create calls create with a replica count and returns the count that
// succeeded. want > 0 forces that count; want == 0 tries Max, then each
// smaller count down to 1, moving on only while create's error says the
// servers cannot place that many replicas (TooFewPeers). Each call gets a
// context bounded by ctx and by a few seconds; a call that ran out of its
// few seconds is made again while ctx lasts. Any other error, or the
// error for the last count, is returned wrapped with the count tried.
// want must be 0 to 5. It blocks until a call succeeds or ctx ends.
func Create(ctx context.Context, want int, create func(ctx context.Context, replicas int) error) (int, error) {
	if want < 0 || want > 5 {
		return 0, fmt.Errorf("replicas %d: want 0 (auto) to 5", want)
	}
	tries := []int{want}
	if want == 0 {
		tries = tries[:0]
		for r := Max; r >= 1; r-- {
			tries = append(tries, r)
		}
	}
	for _, r := range tries {
		err := attempt(ctx, r, create)
		if err == nil {
			return r, nil
		}
		if !TooFewPeers(err) || r == tries[len(tries)-1] {
			return 0, fmt.Errorf("replicas %d: %w", r, err)
		}
	}
	return 0, errors.New("replicas: no count to try") // not reached: tries is never empty
}

// attempt calls create for r until it answers within attemptTimeout, with
// anything but Unavailable, or ctx ends.
func attempt(ctx context.Context, r int, create func(ctx context.Context, replicas int) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := create(actx, r)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil || !(timedOut || Unavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(100+rand.IntN(400)) * time.Millisecond):
		}
	}
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
