package client

import (
	"strings"

	"github.com/tetherfleet/tether/protocol"
)

// checkParamsUTF8 refuses exec and pty stream params (OpenStream's) that
// hold a string that is not valid UTF-8 (protocol's CheckUTF8): JSON
// would carry each such byte as U+FFFD and the node run another command.
// The refusal is the class the coordinator answers bad params with, 400
// invalid_request, naming the kind, the node, the field and the byte.
// Other params are left to the coordinator.
func checkParamsUTF8(node string, kind protocol.Kind, params any) error {
	var err error
	switch p := params.(type) {
	case *protocol.ExecParams:
		err = p.CheckUTF8()
	case protocol.ExecParams:
		err = p.CheckUTF8()
	case *protocol.PTYParams:
		err = p.CheckUTF8()
	case protocol.PTYParams:
		err = p.CheckUTF8()
	}
	if err == nil {
		return nil
	}
	return protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%s stream to node %s: %s", kind, node, strings.ReplaceAll(err.Error(), "\n", "; "))
}
