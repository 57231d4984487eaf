package client

// SetPerRequestReplies makes c subscribe once per exec request, as before
// the shared reply subscription, for the benchmark that compares the two.
func SetPerRequestReplies(c *Client, on bool) { c.perRequest = on }
