package protocol

import (
	"strings"
	"testing"
)

// A job id is a token of the job store's keys (job.<id>) and of subjects,
// where an empty token is refused: "a..b" passed ValidJobID, and the store
// then answered a job lookup with 503 "nats: invalid key", which tether job
// wait retried without end (fresh-user pass fresh20).
func TestValidJobIDRefusesEmptyToken(t *testing.T) {
	for _, id := range []string{"a..b", "x...y"} {
		if err := ValidJobID(id); err == nil || !strings.Contains(err.Error(), "two dots in a row") {
			t.Errorf("ValidJobID(%q) = %v, want two dots in a row refused", id, err)
		}
	}
	for _, id := range []string{"a.b", "240c8a4bb3166677e8a31013", "run-7_a.2"} {
		if err := ValidJobID(id); err != nil {
			t.Errorf("ValidJobID(%q) = %v", id, err)
		}
	}
}
