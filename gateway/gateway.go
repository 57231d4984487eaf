package gateway

import "errors"

// ErrNotFound is returned (wrapped) when the gateway says the sandbox does
// not exist: OpenShell NOT_FOUND, OpenSandbox HTTP 404. Deleting a sandbox
// that is not found is done, not failed.
var ErrNotFound = errors.New("gateway: sandbox not found")
