package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// A request that is only partly understood must not run, through either
// door: the NATS exec API and the stream relay (whose params the agent
// decodes). Each body below ran on a real agent before the strict decoder
// (keys matched by case, the last of two keys winning, invalid UTF-8
// turned into U+FFFD); now each is refused and nothing runs.
func TestAmbiguousRequestsDoNotRun(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	dir := t.TempDir()
	marker := func(name string) string { return filepath.Join(dir, name) }
	q := func(s string) string { return strconv.Quote(s) }

	api := []struct{ name, body, code string }{
		{"case-insensitive keys", `{"Target":{"Node":"node-0"},"Argv":["touch",` + q(marker("case")) + `]}`, protocol.ErrCodeUnknownField},
		{"upper-case twin", `{"target":{"node":"node-0"},"argv":["true"],"ARGV":["touch",` + q(marker("twin")) + `]}`, protocol.ErrCodeUnknownField},
		{"key twice", `{"target":{"node":"node-0"},"argv":["true"],"argv":["touch",` + q(marker("twice")) + `]}`, protocol.ErrCodeMalformed},
		{"invalid UTF-8", `{"target":{"node":"node-0"},"argv":["touch",` + strings.TrimSuffix(q(marker("utf8")), `"`) + "\xff\"]}", protocol.ErrCodeMalformed},
	}
	for _, tt := range api {
		t.Run("api/"+tt.name, func(t *testing.T) {
			r, err := execRaw(f.NC, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.err == nil {
				t.Fatalf("ran (%d replies); want 400 %s", len(r.msgs), tt.code)
			}
			if r.err.Status != 400 || r.err.Code != tt.code {
				t.Errorf("got %d %s %q, want 400 %s", r.err.Status, r.err.Code, r.err.Message, tt.code)
			}
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	relay := []struct{ name, params string }{
		{"case-insensitive keys", `{"Argv":["touch",` + q(marker("relay-case")) + `]}`},
		{"key twice", `{"argv":["true"],"argv":["touch",` + q(marker("relay-twice")) + `]}`},
		{"surrogate", `{"argv":["touch",` + strings.TrimSuffix(q(marker("relay-surrogate")), `"`) + `\ud800"]}`},
	}
	for _, tt := range relay {
		t.Run("relay/"+tt.name, func(t *testing.T) {
			st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, json.RawMessage(tt.params))
			if err != nil {
				// Refused by the coordinator: fine, as long as it says why.
				var e *protocol.APIError
				if !errors.As(err, &e) || e.Status != 400 {
					t.Fatalf("OpenStream: %v, want a 400 or the agent's error frame", err)
				}
				return
			}
			defer st.Close()
			fm, err := protocol.NewFrameReader(st).Next()
			if err != nil || fm.Type != protocol.FrameError {
				t.Fatalf("first frame %v %q, %v; want the agent's error frame", fm.Type, fm.Payload, err)
			}
		})
	}

	// Every exec above would have created its marker, synchronously, before
	// its result; the refusals came first, so none may exist.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("%s exists: an ambiguous request ran", e.Name())
	}
}
