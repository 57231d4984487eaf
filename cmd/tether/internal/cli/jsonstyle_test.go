package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestJSONOutputsOneStyle: every --json output that is not a stream is
// one JSON object, indented by two spaces, its list under a name
// ({"nodes": […]}, {"jobs": […]}, {"sandboxes": […]}). Fresh-user pass 17:
// `nodes --json` was indented, `job list --json` one compact line and
// `sandboxes --json` a bare [].
func TestJSONOutputsOneStyle(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true, Gateways: &fleettest.GatewayOptions{}})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	id := startDetached(ctx, t, url, "true")
	for _, tt := range []struct {
		args []string
		key  string // the named list, if any
	}{
		{[]string{"nodes"}, "nodes"},
		{[]string{"sandboxes"}, "sandboxes"},
		{[]string{"job", "wait", id}, ""},
		{[]string{"job", "status", id}, ""},
		{[]string{"job", "list"}, "jobs"},
	} {
		what := strings.Join(tt.args, " ") + " --json"
		r := runCLI(ctx, nil, "", append(tt.args, "--nats-url", url, "--json")...)
		if r.code != 0 {
			t.Errorf("%s: exit %d, stderr %q", what, r.code, r.stderr)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		var m map[string]json.RawMessage
		if err := dec.Decode(&m); err != nil {
			t.Errorf("%s: %v: want one JSON object; stdout %q", what, err, r.stdout)
			continue
		}
		if _, err := dec.Token(); err != io.EOF {
			t.Errorf("%s: more than one JSON document: %q", what, r.stdout)
		}
		var want bytes.Buffer
		json.Indent(&want, []byte(r.stdout), "", "  ")
		if !strings.HasPrefix(r.stdout, "{\n  \"") || strings.TrimSpace(want.String()) != strings.TrimSpace(r.stdout) {
			t.Errorf("%s: not indented by two spaces: %q", what, r.stdout)
		}
		if l, ok := m[tt.key]; tt.key != "" && (!ok || !bytes.HasPrefix(l, []byte("["))) {
			t.Errorf("%s: no %q list: %q", what, tt.key, r.stdout)
		}
	}
}
