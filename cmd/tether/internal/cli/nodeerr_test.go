package cli

import (
	"errors"
	"io"
	"testing"
)

func TestOnNodeNamesTheNodeOnce(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{io.ErrUnexpectedEOF, "node vm: unexpected EOF"},
		{errors.New("ssh stream on node vm: pipe reset"), "ssh stream on node vm: pipe reset"},
		{errors.New("node vm: cwd /x: no such file"), "node vm: cwd /x: no such file"},
		{errors.New("read from the node: EOF"), "node vm: read from the node: EOF"},
		{errors.New("pty stream on node vm2: reset"), "node vm: pty stream on node vm2: reset"},
	} {
		if got := onNode("vm", tt.err).Error(); got != tt.want {
			t.Errorf("onNode(vm, %q) = %q, want %q", tt.err, got, tt.want)
		}
	}
	if !errors.Is(onNode("vm", io.ErrUnexpectedEOF), io.ErrUnexpectedEOF) {
		t.Error("onNode lost the wrapped error")
	}
}
