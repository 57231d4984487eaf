package jsreplicas

import "time"

// SetAttemptTimeout sets the bound of one create call until the test ends
// (restore with the value returned).
func SetAttemptTimeout(d time.Duration) (old time.Duration) {
	old, attemptTimeout = attemptTimeout, d
	return old
}
