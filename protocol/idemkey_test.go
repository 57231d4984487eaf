package protocol

import "testing"

// A key carrying control characters (CR/LF above all) would forge lines
// where it is shown: it is refused at validation.
func TestValidateRefusesIdempotencyKeyControlChars(t *testing.T) {
	for _, k := range []string{"a\r\nNats-Expected-Stream: x", "a\x01b", "a\x7fb", "a\tb"} {
		r := &ExecRequest{Target: Target{Node: "n"}, Argv: []string{"true"}, Idempotent: true, IdempotencyKey: k}
		if err := r.Validate(); err == nil || err.Status != 400 {
			t.Errorf("key %q: Validate = %v, want 400 invalid", k, err)
		}
	}
	r := &ExecRequest{Target: Target{Node: "n"}, Argv: []string{"true"}, Idempotent: true, IdempotencyKey: "deploy-42/ok"}
	if err := r.Validate(); err != nil {
		t.Errorf("plain key: Validate = %v, want nil", err)
	}
}

// Each problem of a key is named alone: its length, or its want of
// idempotent (one message said both, whichever was wrong).
func TestValidateIdempotencyKeyMessages(t *testing.T) {
	long := &ExecRequest{Target: Target{Node: "n"}, Argv: []string{"true"}, Idempotent: true, IdempotencyKey: string(make([]byte, 300))}
	if err := long.Validate(); err == nil || err.Message != "idempotency_key: 300 bytes, at most 256" {
		t.Errorf("long key: %v", err)
	}
	alone := &ExecRequest{Target: Target{Node: "n"}, Argv: []string{"true"}, IdempotencyKey: "k"}
	if err := alone.Validate(); err == nil || err.Message != "idempotency_key is given without idempotent" {
		t.Errorf("key without idempotent: %v", err)
	}
}
