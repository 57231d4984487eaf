package client

import (
	"testing"

	"github.com/nats-io/nats.go/micro"
)

// apiError reads the headers micro writes.
func TestMicroErrorHeaders(t *testing.T) {
	if microErrorCodeHeader != micro.ErrorCodeHeader || microErrorHeader != micro.ErrorHeader {
		t.Fatalf("client reads %q and %q, micro writes %q and %q", microErrorCodeHeader, microErrorHeader, micro.ErrorCodeHeader, micro.ErrorHeader)
	}
}
