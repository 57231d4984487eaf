package opensandbox

import "time"

// SetAuthClock sets the clock of c's failed-authentication limiter
// (tests: a frozen clock keeps a throttled spell from ending mid-test).
func SetAuthClock(c *Config, now func() time.Time) { c.authNow = now }
