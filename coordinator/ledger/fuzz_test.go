package ledger

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tetherfleet/tether/protocol"
)

// FuzzLedgerEntries decodes key-value entries as the ledger's watcher and
// readers do: record keys (parseKVKey, and the tokens of lease and
// inventory keys, decodeToken), sandbox records (decodeSandboxEntry) and
// leases (decodeLeaseEntry). Whatever another coordinator, an older
// version or an operator with the bucket open wrote, a decoded key
// encodes back to exactly the key it came from (one key per string), a
// decoded record is stored under its own key, and a decoded value
// re-encodes to a value that decodes the same. Errors are short.
func FuzzLedgerEntries(f *testing.F) {
	rec := Record{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "sb.1", Name: "x", Labels: map[string]string{"a": "b"}, State: StateLive}
	b, _ := json.Marshal(rec.Info())
	f.Add(rec.Key().kvKey(), b)
	f.Add("openshell.n1.sb", b)
	f.Add("=0", []byte(`{"run":"r","ttl_ms":60000,"closed":true}`))
	f.Add("=c5h66", []byte(`{"ttl_ms":9223372036854775807}`))
	f.Add("run-1", []byte(`{"ttl_ms":-1}`))
	f.Add("opensandbox.=c5h66.x", []byte(`{"provider":"opensandbox","node":"abc","id":"x"}`))
	f.Add("a.b", []byte(`null`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		short := func(what string, err error) {
			if len(err.Error()) > 600 {
				t.Fatalf("%s %.100q: a message of %d bytes", what, key, len(err.Error()))
			}
		}
		if s, err := decodeToken(key); err != nil {
			short("token", err)
		} else if encodeToken(s) != key {
			t.Fatalf("token %q decodes to %q, which encodes to %q", key, s, encodeToken(s))
		}
		if k, err := parseKVKey(key); err != nil {
			short("key", err)
		} else if k.kvKey() != key {
			t.Fatalf("key %q parses to %+v, which is stored under %q", key, k, k.kvKey())
		}
		if r, err := decodeSandboxEntry(key, value); err != nil {
			short("record", err)
		} else {
			if r.Key().kvKey() != key {
				t.Fatalf("record %+v decoded from key %q, its own is %q", r.Key(), key, r.Key().kvKey())
			}
			if err := validKey(r.Key()); err != nil {
				t.Fatalf("record %+v decoded with an invalid key: %v", r.Key(), err)
			}
			if r.TTL < 0 {
				t.Fatalf("record %+v decoded with TTL %v", r.Key(), r.TTL)
			}
			b, err := json.Marshal(r.Info())
			if err != nil {
				t.Fatal(err)
			}
			again, err := decodeSandboxEntry(key, b)
			if err != nil {
				t.Fatalf("record %q re-encoded as %q refused: %v", value, b, err)
			}
			if !equalStored(r, again) {
				t.Fatalf("record %q changed in a round trip through %q:\n%s", value, b, cmp.Diff(r, again, cmpopts.EquateEmpty()))
			}
		}
		if ls, err := decodeLeaseEntry(key, value); err != nil {
			short("lease", err)
		} else {
			if encodeToken(ls.Run) != key || ls.TTL < 0 {
				t.Fatalf("lease %q: run %q, TTL %v", key, ls.Run, ls.TTL)
			}
			b, err := json.Marshal(ls.Info())
			if err != nil {
				t.Fatal(err)
			}
			again, err := decodeLeaseEntry(key, b)
			if err != nil {
				t.Fatalf("lease %q re-encoded as %q refused: %v", value, b, err)
			}
			if diff := cmp.Diff(ls, again, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("lease %q changed in a round trip through %q:\n%s", value, b, diff)
			}
		}
	})
}

// TestDecodeEntriesRefuseAliases: a record stored under a key other than
// its own, a token that is not in encodeToken's form and a TTL past a
// time.Duration are refused; they were indexed (a record under a second
// key, which the reaper then purged under the first; a run "abc" under
// two keys; a negative TTL).
func TestDecodeEntriesRefuseAliases(t *testing.T) {
	rec := Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "sb-1", State: StateLive}
	b, _ := json.Marshal(rec.Info())
	if _, err := decodeSandboxEntry("opensandbox.n2.sb-1", b); err == nil || !strings.Contains(err.Error(), "not its own") {
		t.Errorf("record of n1 under n2's key: %v", err)
	}
	if _, err := decodeSandboxEntry(rec.Key().kvKey(), b); err != nil {
		t.Errorf("record under its own key: %v", err)
	}
	for _, tok := range []string{"=" + b32.EncodeToString([]byte("abc")), "=01", "a/b", ""} {
		if s, err := decodeToken(tok); err == nil {
			t.Errorf("decodeToken(%q) = %q, want an error", tok, s)
		}
	}
	if _, err := decodeLeaseEntry("r1", []byte(`{"ttl_ms":9223372036854775807}`)); err == nil {
		t.Error("a lease TTL past time.Duration accepted")
	}
}
