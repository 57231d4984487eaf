package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tetherfleet/tether/protocol"
)

// These fuzzers drive every decoder and validator of the protocol that a
// daemon applies to bytes from the network (stream params of each kind,
// NATS API requests, control-stream and copy frames, durations, labels)
// and check properties, not only the absence of a panic: what is accepted
// passes validation and survives a round trip through its encoder; what is
// refused is refused with an error whose every problem is short, whatever
// the size of the input (values are clipped, see protocol.Clip). Seeds run
// as ordinary tests; the fuzzer's finds are kept in testdata/fuzz/FuzzX.

// maxProblemLen bounds the text of one problem of an error: enough for a
// sentence and three clipped values (protocol.Clip keeps 64 bytes, which
// quote to at most 4*64+2 bytes when none is printable: a selector, its
// term and the key in it).
const maxProblemLen = 1200

// checkProblems fails t if a problem of err is longer than maxProblemLen.
// A joined error (errors.Join) is a list of problems; a wrapper around one
// adds a prefix, which counts against each.
func checkProblems(t *testing.T, what string, err error) {
	t.Helper()
	var walk func(e error, prefix int)
	walk = func(e error, prefix int) {
		if j, ok := e.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 1 {
			for _, c := range j.Unwrap() {
				walk(c, prefix)
			}
			return
		}
		// A wrapper of a list: count its own words once per problem.
		if u := errors.Unwrap(e); u != nil {
			if j, ok := u.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 1 {
				walk(u, prefix+max(0, len(e.Error())-len(u.Error())))
				return
			}
		}
		if n := prefix + len(e.Error()); n > maxProblemLen {
			t.Fatalf("%s: a problem of %d bytes (over %d; is a value not clipped?): %.300q…", what, n, maxProblemLen, e.Error())
		}
	}
	walk(err, 0)
}

// equalDecodedParams compares decoded values, nil and empty alike.
var equalDecodedParams = cmpopts.EquateEmpty()

// streamParamsOf returns a new params value of kind k and whether the
// agent checks it with a Validate method.
func streamParamsOf(k protocol.Kind) (any, bool) {
	switch k {
	case protocol.KindExec:
		return &protocol.ExecParams{}, true
	case protocol.KindPTY:
		return &protocol.PTYParams{}, true
	case protocol.KindCopy:
		return &protocol.CopyParams{}, true
	case protocol.KindDial:
		return &protocol.DialParams{}, false
	case protocol.KindJob:
		return &protocol.JobParams{}, true
	case protocol.KindSandbox:
		return &protocol.SandboxOpParams{}, true
	case protocol.KindInventory:
		return &protocol.InventoryParams{}, false
	case protocol.KindControl:
		return &protocol.ControlParams{}, false
	case protocol.KindSSH:
		return &protocol.SSHParams{}, true
	}
	return nil, false
}

// FuzzStreamParams drives the params of every stream kind through the
// checks an agent applies to a stream header (strict decoding into the
// kind's struct, then its Validate; CheckStreamParams for the four kinds
// the coordinator's relay passes on). Accepted params validate, re-encode
// (MarshalJSON, as WriteHeader sends them) to params that are accepted
// again and decode to the same value; refused ones are refused with short
// problems that wrap ErrMalformedJSON when they do not decode.
func FuzzStreamParams(f *testing.F) {
	for _, s := range []struct {
		k protocol.Kind
		p string
	}{
		{protocol.KindExec, `{"argv":["echo","hi"],"env":{"A":"1"},"cwd":"/tmp","timeout_ms":1000}`},
		{protocol.KindExec, `{"commands":["true",""],"fail_fast":true}`},
		{protocol.KindExec, `{"script":"echo hi","stdin":true}`},
		{protocol.KindExec, `{"argv":["x"],"detach":true,"job_id":"j-1","output_limit":-1}`},
		{protocol.KindExec, `{"argv":["x"],"timeout_ms":9223372036854775807}`},
		{protocol.KindPTY, `{"argv":["bash"],"rows":24,"cols":80,"term":"xterm"}`},
		{protocol.KindPTY, `{"argv":[""],"env":{"=":"x"}}`},
		{protocol.KindCopy, `{"direction":"push","path":"/srv/x","delete":true,"into":true}`},
		{protocol.KindCopy, `{"direction":"pull","path_b64":"L3Nydi//"}`},
		{protocol.KindCopy, `{"direction":"pull","path":"/a","path_b64":"L2E="}`},
		{protocol.KindDial, `{"target":"openshell"}`},
		{protocol.KindJob, `{"op":"output","id":"j1","stream":"stdout","offset":5,"limit":100}`},
		{protocol.KindJob, `{"op":"cancel","id":".."}`},
		{protocol.KindSandbox, `{"op":"delete","provider":"opensandbox","id":"sb-1"}`},
		{protocol.KindSandbox, `{"op":"delete","provider":"openshell","workspace":"w","name":"n"}`},
		{protocol.KindInventory, `{}`},
		{protocol.KindControl, `{}`},
		{protocol.KindSSH, `{"session":"0123456789abcdef0123456789abcdef","identity":"ssh-key:SHA256:x","logins":["deploy"],"targets":["openshell"],"auth":"publickey","public_key":"AAAA"}`},
		{protocol.KindSSH, `{"session":"00","identity":"","logins":[],"auth":"none","public_key":"AAAA"}`},
		{protocol.KindExec, `{"argv":["x"],"argv":["y"]}`},
		{protocol.KindJob, `{"op":"` + strings.Repeat("x", 5000) + `","id":"` + strings.Repeat("é", 3000) + `"}`},
	} {
		f.Add(uint8(s.k), []byte(s.p))
	}
	f.Fuzz(func(t *testing.T, kind uint8, params []byte) {
		k := protocol.Kind(kind)
		if !k.Valid() {
			k = protocol.KindExec
		}
		what := fmt.Sprintf("%s params %.200q", k, params)
		v, validates := streamParamsOf(k)
		h := protocol.Header{Version: protocol.Version, Kind: k, Params: params}
		err := h.DecodeParams(v)
		if err == nil && validates {
			err = v.(interface{ Validate() error }).Validate()
		}
		relayed := k == protocol.KindExec || k == protocol.KindPTY || k == protocol.KindCopy || k == protocol.KindDial
		if relayed {
			// The relay's check and the agent's are one rule.
			cerr := protocol.CheckStreamParams(k, params)
			if (cerr == nil) != (err == nil) {
				t.Fatalf("%s: CheckStreamParams says %v, the agent's decoding and Validate %v", what, cerr, err)
			}
			if cerr != nil {
				checkProblems(t, what, cerr)
				if !strings.HasPrefix(cerr.Error(), k.String()+" ") {
					t.Fatalf("%s: error does not name the kind: %v", what, cerr)
				}
				e := protocol.StreamParamsAPIError(k, params)
				if e == nil || e.Status != 400 && e.Status != 413 || e.Code == "" {
					t.Fatalf("%s: API error %+v", what, e)
				}
			}
		}
		if err != nil {
			checkProblems(t, what, err)
			return
		}
		b, merr := protocol.MarshalJSON(v)
		if merr != nil {
			t.Fatalf("%s: accepted params do not encode: %v", what, merr)
		}
		again, _ := streamParamsOf(k)
		h2 := protocol.Header{Version: protocol.Version, Kind: k, Params: b}
		if err := h2.DecodeParams(again); err != nil {
			t.Fatalf("%s: re-encoded %q refused: %v", what, b, err)
		}
		if validates {
			if err := again.(interface{ Validate() error }).Validate(); err != nil {
				t.Fatalf("%s: re-encoded %q invalid: %v", what, b, err)
			}
		}
		if diff := cmp.Diff(v, again, equalDecodedParams); diff != "" {
			t.Fatalf("%s: round trip through %q changed it (-first +again):\n%s", what, b, diff)
		}
		if relayed {
			if err := protocol.CheckStreamParams(k, b); err != nil {
				t.Fatalf("%s: re-encoded %q refused by CheckStreamParams: %v", what, b, err)
			}
		}
	})
}

// apiRequest is one NATS API request type: a new value, and its Validate
// (nil for the requests a handler checks itself).
type apiRequest struct {
	name     string
	new      func() any
	validate func(v any) *protocol.APIError
}

func validator[T any, P interface {
	*T
	Validate() *protocol.APIError
}]() func(any) *protocol.APIError {
	return func(v any) *protocol.APIError { return P(v.(*T)).Validate() }
}

var apiRequests = []apiRequest{
	{"exec", func() any { return new(protocol.ExecRequest) }, validator[protocol.ExecRequest]()},
	{"nodes", func() any { return new(protocol.NodesRequest) }, validator[protocol.NodesRequest]()},
	{"job", func() any { return new(protocol.JobRequest) }, validator[protocol.JobRequest]()},
	{"job output", func() any { return new(protocol.JobOutputRequest) }, validator[protocol.JobOutputRequest]()},
	{"lease open", func() any { return new(protocol.LeaseOpenRequest) }, validator[protocol.LeaseOpenRequest]()},
	{"lease", func() any { return new(protocol.LeaseRequest) }, validator[protocol.LeaseRequest]()},
	{"sandboxes list", func() any { return new(protocol.SandboxesListRequest) }, validator[protocol.SandboxesListRequest]()},
	{"sandbox register", func() any { return new(protocol.SandboxRegisterRequest) }, validator[protocol.SandboxRegisterRequest]()},
	{"reap", func() any { return new(protocol.ReapRequest) }, validator[protocol.ReapRequest]()},
	{"cancel", func() any { return new(protocol.CancelRequest) }, nil},
	{"stream", func() any { return new(protocol.StreamRequest) }, nil},
	{"token create", func() any { return new(protocol.TokenCreateRequest) }, validator[protocol.TokenCreateRequest]()},
	{"node revoke", func() any { return new(protocol.NodeRevokeRequest) }, validator[protocol.NodeRevokeRequest]()},
}

// FuzzAPIRequests decodes a body as each NATS API request (DecodeRequest,
// then the request's Validate, as the coordinator's handlers do; exec
// through DecodeExecRequest). A refusal is an APIError with a status of
// 400 or 413, a code and a message of bounded size; an accepted request
// re-encodes (json.Marshal, as the client sends it) to a body that is
// accepted again, with the same value.
func FuzzAPIRequests(f *testing.F) {
	for i, s := range []string{
		`{"target":{"node":"a"},"argv":["true"],"timeout":"1s","env":{"A":"B"}}`,
		`{"selector":"gpu in (a,b)","limit":10,"offset":2}`,
		`{"node":"n1","id":"job-1"}`,
		`{"node":"n1","id":"job-1","stream":"stderr","offset":3,"limit":4096}`,
		`{"run":"r-1","ttl_ms":60000,"holder":"host:1"}`,
		`{"run":"r-1"}`,
		`{"run":"r","node":"n","state":"live","provider":"openshell","limit":5,"after":"x"}`,
		`{"provider":"opensandbox","node":"n","id":"sb-1","labels":{"a":"b"},"ttl_ms":5}`,
		`{"run":"r","dry_run":true}`,
		`{"id":"job-1"}`,
		`{"node":"n","kind":"exec","params":{"argv":["x"]}}`,
		`{"Target":{"node":"a"}}`,
		`{"selector":"` + strings.Repeat("a", 4000) + `,"}`,
		`{"` + strings.Repeat("k", 3000) + `":1}`,
		`{"stdin":"!!!!"}`,
		`[]`,
	} {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		rt := apiRequests[int(which)%len(apiRequests)]
		what := fmt.Sprintf("%s request %.200q", rt.name, data)
		v := rt.new()
		e := protocol.DecodeRequest(data, v)
		if e == nil && rt.validate != nil {
			e = rt.validate(v)
		}
		if rt.name == "exec" {
			req, e2 := protocol.DecodeExecRequest(data)
			if (e == nil) != (e2 == nil) {
				t.Fatalf("%s: DecodeRequest+Validate says %v, DecodeExecRequest %v", what, e, e2)
			}
			if e2 != nil {
				e = e2
			} else {
				v = req
			}
		}
		if e != nil {
			if e.Status != 400 && e.Status != 413 || e.Code == "" || e.Message == "" {
				t.Fatalf("%s: error without status, code or message: %+v", what, e)
			}
			if len(e.Message) > 2*maxProblemLen {
				t.Fatalf("%s: a message of %d bytes (is a value not clipped?): %.300q…", what, len(e.Message), e.Message)
			}
			return
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: accepted request does not encode: %v", what, err)
		}
		again := rt.new()
		if e := protocol.DecodeRequest(b, again); e != nil {
			t.Fatalf("%s: re-encoded %q refused: %v", what, b, e)
		}
		if rt.validate != nil {
			if e := rt.validate(again); e != nil {
				t.Fatalf("%s: re-encoded %q invalid: %v", what, b, e)
			}
		}
		if diff := cmp.Diff(v, again, equalDecoded); diff != "" {
			t.Fatalf("%s: round trip through %q changed it (-first +again):\n%s", what, b, diff)
		}
	})
}

// FuzzDuration decodes a JSON value as the API's timeout (Duration):
// accepted values round-trip through MarshalJSON, and an exec request with
// that timeout is either refused naming the timeout or sent with a timeout
// of at least the one asked for, in whole milliseconds, never "none" (0)
// or negative.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{`"30s"`, `90`, `1.5`, `-1`, `0`, `null`, `"1h2m3.5s"`, `1e300`, `"-5m"`, `4611686018.427387904`,
		`"2562047h47m16.854775807s"`, `"1ns"`, `0.0000000001`, `"x"`, `true`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d protocol.Duration
		if err := d.UnmarshalJSON(data); err != nil {
			if len(err.Error()) > maxProblemLen {
				t.Fatalf("%.100q: a message of %d bytes", data, len(err.Error()))
			}
			return
		}
		b, err := d.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var again protocol.Duration
		if err := again.UnmarshalJSON(b); err != nil || again != d {
			t.Fatalf("%.100q → %v → %s → %v, %v", data, time.Duration(d), b, time.Duration(again), err)
		}
		req := protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}, Timeout: d}
		if e := req.Validate(); e != nil {
			if !strings.Contains(e.Message, "timeout") {
				t.Fatalf("timeout %v: refused without naming the timeout: %v", time.Duration(d), e)
			}
			if d > 0 && strings.Contains(e.Message, "negative") {
				t.Fatalf("timeout %v: refused as negative: %v", time.Duration(d), e)
			}
			return
		}
		p := req.Params(time.Minute)
		switch {
		case d > 0 && (p.TimeoutMS <= 0 || time.Duration(p.TimeoutMS) < time.Duration(d)/time.Millisecond):
			t.Fatalf("timeout %v accepted but sent as timeout_ms %d", time.Duration(d), p.TimeoutMS)
		case d == 0 && p.TimeoutMS != time.Minute.Milliseconds():
			t.Fatalf("no timeout: sent as %d ms, want the default", p.TimeoutMS)
		case p.TimeoutMS > protocol.MaxTimeoutMS:
			t.Fatalf("timeout %v accepted but sent as %d ms, over MaxTimeoutMS", time.Duration(d), p.TimeoutMS)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("timeout %v accepted, but the agent refuses its params: %v", time.Duration(d), err)
		}
	})
}

// FuzzLabels parses labels as the agent's --labels flag does
// (ParseLabels) and checks node ids, label keys and values (ValidNodeID,
// ValidLabelKey, ValidLabelValue, as the coordinator checks a Hello).
// Accepted labels validate and parse back from their canonical form;
// errors are short.
func FuzzLabels(f *testing.F) {
	for _, s := range []string{"", "a=b", "gpu=a100, zone = eu-1 ,", "a=1,a=2", "example.com/x=y", "=v", "k", "a=b=c",
		"Ex.com/x=y", strings.Repeat("k", 70) + "=v", strings.Repeat("x=y,", 70), "a=" + strings.Repeat("é", 2000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, check := range []func(string) error{protocol.ValidNodeID, protocol.ValidLabelKey, protocol.ValidLabelValue} {
			if err := check(s); err != nil {
				checkProblems(t, fmt.Sprintf("%.100q", s), err)
			}
		}
		m, err := protocol.ParseLabels(s)
		if err != nil {
			checkProblems(t, fmt.Sprintf("labels %.100q", s), err)
			return
		}
		if err := protocol.ValidateLabels(m); err != nil {
			t.Fatalf("labels %q accepted as %v, which is invalid: %v", s, m, err)
		}
		var parts []string
		for k, v := range m {
			parts = append(parts, k+"="+v)
		}
		sort.Strings(parts)
		again, err := protocol.ParseLabels(strings.Join(parts, ","))
		if err != nil || !cmp.Equal(m, again, cmpopts.EquateEmpty()) {
			t.Fatalf("labels %q → %v → %q → %v, %v", s, m, parts, again, err)
		}
	})
}

// FuzzCopyFrames decodes the JSON frames of a copy stream (entries,
// skips, results, manifest entries) as the receivers do (DecodeJSON, then
// DecodeNames and Validate): accepted values encode (EncodeNames) to
// frames that decode to the same value, every name byte intact; refusals
// are short.
func FuzzCopyFrames(f *testing.F) {
	for i, s := range []string{
		`{"path":".","type":"dir","mode":493,"total_files":2,"total_bytes":5}`,
		`{"path":"a/b","type":"file","size":3,"mode":420,"mtime_ns":1}`,
		`{"path_b64":"/w==","type":"symlink","link_b64":"Li4v/w=="}`,
		`{"path":".","type":"file","name":"x","size":1}`,
		`{"path":"a","path_b64":"YQ==","type":"file"}`,
		`{"path":"../x","type":"file"}`,
		`{"path":"a","reason":"named pipe"}`,
		`{"entries":1,"bytes":2,"skipped":[{"path_b64":"/w==","reason":"r"}]}`,
		`{"path":"` + strings.Repeat("a/", 3000) + `","type":"file"}`,
	} {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		type named interface {
			EncodeNames()
			DecodeNames() error
		}
		var v, again named
		var validate func() error
		switch which % 4 {
		case 0:
			e, e2 := &protocol.CopyEntry{}, &protocol.CopyEntry{}
			v, again, validate = e, e2, e.Validate
		case 1:
			e, e2 := &protocol.CopySkip{}, &protocol.CopySkip{}
			v, again, validate = e, e2, e.Validate
		case 2:
			v, again = &protocol.CopyResult{}, &protocol.CopyResult{}
		case 3:
			e, e2 := &protocol.ManifestEntry{}, &protocol.ManifestEntry{}
			v, again, validate = e, e2, func() error { return protocol.ValidCopyPath(e.Path) }
		}
		what := fmt.Sprintf("%T %.200q", v, data)
		err := protocol.DecodeJSON(data, v)
		if err == nil {
			err = v.DecodeNames()
		}
		if err == nil && validate != nil {
			err = validate()
		}
		if err != nil {
			checkProblems(t, what, err)
			return
		}
		decoded, _ := json.Marshal(v) // names as decoded, for the comparison
		v.EncodeNames()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := protocol.DecodeJSON(b, again); err != nil {
			t.Fatalf("%s: encoded %q refused: %v", what, b, err)
		}
		if err := again.DecodeNames(); err != nil {
			t.Fatalf("%s: encoded %q refused: %v", what, b, err)
		}
		// Compared as Go values: json.Marshal would replace invalid UTF-8
		// on both sides alike.
		v.DecodeNames()
		if diff := cmp.Diff(v, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: round trip through %q changed it (-first +again):\n%s", what, b, diff)
		}
		_ = decoded
	})
}

// FuzzControlFrames decodes the control stream's JSON payloads the way
// each end does (DecodeJSON; a Hello also through Validate, as the
// coordinator checks it before it admits the node): nothing panics, an
// accepted Hello re-encodes to one that is accepted again with the same
// identity, and refusals are short. The agent's reading of cancels is
// FuzzReadControl (agent).
func FuzzControlFrames(f *testing.F) {
	for i, s := range []string{
		`{"protocol_version":1,"token":"t","node_id":"n1","labels":{"a":"b"},"capacity":{"cpus":2},"agent_version":"v","features":["x"]}`,
		`{"session_id":"s","coordinator_id":"c","heartbeat_interval_ms":5000,"limits":{"max_frame_size":1048576}}`,
		`{"rtt_us":12,"running_execs":3}`,
		`{"stream_id":7}`,
		`{"rows":24,"cols":80}`,
		`{"name":"INT"}`,
		`{"code":"internal","message":"boom"}`,
		`{"exit_code":3,"signal":"KILL"}`,
		`{"protocol_version":1,"node_id":"` + strings.Repeat("n", 3000) + `","labels":{"` + strings.Repeat("k", 3000) + `":"v"}}`,
		`{"protocol_version":1,"token":"tjt_x","node_id":"n1","csr":"MIIB"}`,
		`{"certificate":"MIIB","not_after":"2026-12-03T10:00:00Z","labels":{"rack":"r1"}}`,
		`{"csr":"MIIB"}`,
	} {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		vals := []any{&protocol.Hello{}, &protocol.Welcome{}, &protocol.Heartbeat{}, &protocol.CancelStream{},
			&protocol.WindowSize{}, &protocol.Signal{}, &protocol.ErrorInfo{}, &protocol.ExitStatus{},
			&protocol.Enroll{}, &protocol.Enrolled{}, &protocol.Renew{}}
		v := vals[int(which)%len(vals)]
		err := protocol.DecodeJSON(data, v)
		if err != nil {
			return
		}
		if e, ok := v.(*protocol.Enroll); ok {
			if err := e.Validate(); err != nil {
				checkProblems(t, fmt.Sprintf("enroll %.200q", data), err)
			}
			return
		}
		h, ok := v.(*protocol.Hello)
		if !ok {
			return
		}
		if err := h.Validate(); err != nil {
			checkProblems(t, fmt.Sprintf("hello %.200q", data), err)
			return
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		var again protocol.Hello
		if err := protocol.DecodeJSON(b, &again); err != nil {
			t.Fatalf("hello %q re-encoded as %q refused: %v", data, b, err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("hello %q re-encoded as %q invalid: %v", data, b, err)
		}
		if again.NodeID != h.NodeID || !cmp.Equal(again.Labels, h.Labels, cmpopts.EquateEmpty()) {
			t.Fatalf("hello %q: identity changed in a round trip: %+v → %+v", data, h, again)
		}
	})
}

// The selector fuzzer (FuzzSelector, fuzz_test.go) checks the parser's
// own properties; formatSelector is its canonical printer.
func formatSelector(s protocol.Selector) string {
	var parts []string
	for _, r := range s.Reqs {
		switch r.Op {
		case protocol.OpEquals:
			parts = append(parts, r.Key+"="+r.Values[0])
		case protocol.OpNotEquals:
			parts = append(parts, r.Key+"!="+r.Values[0])
		case protocol.OpIn:
			parts = append(parts, r.Key+" in ("+strings.Join(r.Values, ",")+")")
		case protocol.OpNotIn:
			parts = append(parts, r.Key+" notin ("+strings.Join(r.Values, ",")+")")
		case protocol.OpExists:
			parts = append(parts, r.Key)
		case protocol.OpNotExists:
			parts = append(parts, "!"+r.Key)
		}
	}
	return strings.Join(parts, ",")
}
