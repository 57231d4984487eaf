package jsreplicas

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Max is the replica count Create tries first: three copies survive the
// loss of any one server and keep a quorum.
const Max = 3

// Create calls create with a replica count and returns the count that
// succeeded. want > 0 forces that count (one call); want == 0 tries Max,
// then each smaller count down to 1, moving on only while create's error
// says the servers cannot place that many replicas (TooFewPeers). Any
// other error, or the error for replicas 1, is returned wrapped with the
// count tried. want must be 0 to 5.
func Create(want int, create func(replicas int) error) (int, error) {
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
	var err error
	for _, r := range tries {
		if err = create(r); err == nil {
			return r, nil
		}
		if !TooFewPeers(err) || r == tries[len(tries)-1] {
			return 0, fmt.Errorf("replicas %d: %w", r, err)
		}
	}
	return 0, err // not reached: the last try returns
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
