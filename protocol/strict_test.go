package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// A request that is only partly understood must not run. encoding/json
// alone matches keys case-insensitively (even with DisallowUnknownFields),
// lets the last of two equal keys win and turns invalid UTF-8 into U+FFFD;
// each of those lets a filter that reads the JSON (a policy, a proxy, a
// NATS-level inspector) see another request than the one that runs.
// These bodies must all be refused, with a message naming the field.
func TestDecodeExecRequestRefusesAmbiguousBodies(t *testing.T) {
	tests := []struct {
		name string
		body string
		code string
		want []string // substrings of the message
	}{
		// (1) keys are exact, case-sensitive field names, at every level.
		{"case of every key", `{"Target":{"Node":"vm"},"Argv":["echo","case"]}`, protocol.ErrCodeUnknownField, []string{`"Target"`, `"target"`}},
		{"case of a nested key", `{"target":{"Node":"vm"},"argv":["echo"]}`, protocol.ErrCodeUnknownField, []string{`"target.Node"`, `"node"`}},
		{"upper-case twin of argv", `{"target":{"node":"vm"},"argv":["echo"],"ARGV":["x"]}`, protocol.ErrCodeUnknownField, []string{`"ARGV"`, `"argv"`}},
		{"unicode fold (long s)", `{"target":{"node":"vm"},"ſcript":"id"}`, protocol.ErrCodeUnknownField, []string{`"ſcript"`, `"script"`}},
		// (2) no key twice in one object, however it is spelled.
		{"argv twice", `{"target":{"node":"vm"},"argv":["echo","first"],"argv":["echo","second"]}`, protocol.ErrCodeMalformed, []string{`duplicate key "argv"`}},
		{"argv twice, one escaped", `{"target":{"node":"vm"},"argv":["echo","first"],"\u0061rgv":["echo","second"]}`, protocol.ErrCodeMalformed, []string{`duplicate key "argv"`}},
		{"nested key twice", `{"target":{"node":"vm","node":"other"},"argv":["echo"]}`, protocol.ErrCodeMalformed, []string{`duplicate key "target.node"`}},
		{"env key twice", `{"target":{"node":"vm"},"argv":["env"],"env":{"A":"1","B":"2","A":"3"}}`, protocol.ErrCodeMalformed, []string{`duplicate key "env.A"`}},
		{"env key twice, odd name", `{"target":{"node":"vm"},"argv":["env"],"env":{"a.b":"1","a.b":"3"}}`, protocol.ErrCodeMalformed, []string{`duplicate key`, `a.b`}},
		{"timeout twice", `{"target":{"node":"vm"},"argv":["x"],"timeout":"1s","timeout":"1h"}`, protocol.ErrCodeMalformed, []string{`duplicate key "timeout"`}},
		// (3) the body is UTF-8 (RFC 8259 §8.1), and strings are Unicode.
		{"invalid UTF-8 in argv", "{\"target\":{\"node\":\"vm\"},\"argv\":[\"echo\",\"\xff\xfe\"]}", protocol.ErrCodeMalformed, []string{`invalid UTF-8`, `"argv[1]"`}},
		{"invalid UTF-8 in script", "{\"target\":{\"node\":\"vm\"},\"script\":\"echo \xc3(\"}", protocol.ErrCodeMalformed, []string{`invalid UTF-8`, `"script"`}},
		{"invalid UTF-8 in an env value", "{\"target\":{\"node\":\"vm\"},\"argv\":[\"env\"],\"env\":{\"A\":\"\xed\xa0\x80\"}}", protocol.ErrCodeMalformed, []string{`invalid UTF-8`, `"env.A"`}},
		{"invalid UTF-8 in a key", "{\"target\":{\"node\":\"vm\"},\"argv\":[\"env\"],\"env\":{\"\xff\":\"x\"}}", protocol.ErrCodeMalformed, []string{`invalid UTF-8`, `key`, `"env"`}},
		{"overlong encoding", "{\"target\":{\"node\":\"vm\"},\"argv\":[\"\xc0\xaf\"]}", protocol.ErrCodeMalformed, []string{`invalid UTF-8`, `"argv[0]"`}},
		{"unpaired high surrogate", `{"target":{"node":"vm"},"argv":["echo","\ud800"]}`, protocol.ErrCodeMalformed, []string{`surrogate`, `"argv[1]"`}},
		{"unpaired low surrogate", `{"target":{"node":"vm"},"argv":["echo","\uDC00x"]}`, protocol.ErrCodeMalformed, []string{`surrogate`, `"argv[1]"`}},
		{"high surrogate before a letter", `{"target":{"node":"vm"},"argv":["echo","\ud800\u0041"]}`, protocol.ErrCodeMalformed, []string{`surrogate`, `"argv[1]"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, e := protocol.DecodeExecRequest([]byte(tt.body))
			if e == nil {
				t.Fatalf("accepted as %+v; want %s", req, tt.code)
			}
			if e.Status != 400 || e.Code != tt.code {
				t.Errorf("got %d %s (%s), want 400 %s", e.Status, e.Code, e.Message, tt.code)
			}
			for _, w := range tt.want {
				if !strings.Contains(e.Message, w) {
					t.Errorf("message %q does not contain %q", e.Message, w)
				}
			}
		})
	}
}

// What a correct client sends still decodes, escapes and all.
func TestDecodeExecRequestAcceptsExactBodies(t *testing.T) {
	for _, body := range []string{
		`{"target":{"node":"vm"},"argv":["echo","\ud83d\ude00","\u00e9","é"]}`,
		`{"target":{"node":"vm"},"argv":["env"],"env":{"A":"1","a":"2","\u0042":"3"}}`,
		`{"target":{"node":"vm"},"argv":["x"],"\u0074imeout":"1s"}`,
		" \t\r\n{\"target\":{\"node\":\"vm\"},\"script\":\"echo \\\"ü\\\"\"} \n",
		`{"target":{"node":"vm"},"argv":["x"],"timeout":null,"stdin":null,"env":null}`,
	} {
		if _, e := protocol.DecodeExecRequest([]byte(body)); e != nil {
			t.Errorf("%s: %v", body, e)
		}
	}
}

// Shapes the strict decoder must see through: slices and arrays of
// structs, pointers, maps of structs, embedded structs (promoted fields
// and shadowing), untagged and "-" fields, and opaque values (types with
// their own UnmarshalJSON, json.RawMessage, interfaces), whose keys are not
// fields but must still not repeat.
type shapeInner struct {
	X int    `json:"x"`
	Y string `json:"y,omitempty"`
}

type ShapeEmbedded struct {
	E      string `json:"e"`
	Shadow string `json:"shadow"`
}

type shapeHidden struct {
	H string `json:"h"`
}

type shapeOuter struct {
	Items  []shapeInner             `json:"items"`
	Ptr    *shapeInner              `json:"ptr"`
	PP     **shapeInner             `json:"pp"`
	Arr    [2]shapeInner            `json:"arr"`
	Map    map[string]shapeInner    `json:"map"`
	Nested map[string][]*shapeInner `json:"nested"`
	ShapeEmbedded
	shapeHidden
	Shadow   string            `json:"shadow"` // hides ShapeEmbedded.Shadow
	Untagged string            // named by its Go name
	Skip     string            `json:"-"`
	Dash     string            `json:"-,"` // named "-"
	Opaque   protocol.Duration `json:"opaque"`
	Raw      json.RawMessage   `json:"raw"`
	Any      any               `json:"any"`
	Ints     map[int]string    `json:"ints"`
	Self     *shapeOuter       `json:"self"`
}

func TestDecodeRequestShapes(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string // "" = accepted; else a substring of the message
	}{
		{"all exact", `{"items":[{"x":1},{"x":2,"y":"b"}],"ptr":{"x":3},"pp":{"x":4},"arr":[{"x":5},{"x":6}],"map":{"k":{"x":7}},"nested":{"k":[{"x":8},null]},"e":"e","h":"h","shadow":"s","Untagged":"u","-":"d","opaque":"1s","raw":{"Any":{"Key":1}},"any":{"K":[1,{"k":2}]},"ints":{"1":"a","2":"b"},"self":{"self":{"items":[{"x":9}]}}}`, ""},
		{"slice element key case", `{"items":[{"x":1},{"X":2}]}`, `unknown field "items[1].X"`},
		{"slice element unknown key", `{"items":[{"x":1},{"z":2}]}`, `unknown field "items[1].z"`},
		{"slice element key twice", `{"items":[{"x":1,"x":2}]}`, `duplicate key "items[0].x"`},
		{"pointer key case", `{"ptr":{"X":3}}`, `unknown field "ptr.X"`},
		{"pointer to pointer key case", `{"pp":{"X":3}}`, `unknown field "pp.X"`},
		{"array element key case", `{"arr":[{"x":1},{"Y":"b"}]}`, `unknown field "arr[1].Y"`},
		{"map value key case", `{"map":{"k":{"X":1}}}`, `unknown field "map.k.X"`},
		{"map key twice", `{"map":{"k":{"x":1},"k":{"x":2}}}`, `duplicate key "map.k"`},
		{"map of slices of pointers", `{"nested":{"k k":[null,{"x":1,"Y":"b"}]}}`, `unknown field "nested[\"k k\"][1].Y"`},
		{"promoted field case", `{"E":"x"}`, `unknown field "E"`},
		{"promoted from an unexported embedded struct, case", `{"H":"x"}`, `unknown field "H"`},
		{"embedded struct's own name is not a field", `{"ShapeEmbedded":{"e":"x"}}`, `unknown field "ShapeEmbedded"`},
		{"untagged field by another case", `{"untagged":"u"}`, `unknown field "untagged"`},
		{"skipped field", `{"Skip":"x"}`, `unknown field "Skip"`},
		{"shadowing and promoted twice", `{"shadow":"a","shadow":"b"}`, `duplicate key "shadow"`},
		{"self-recursive type", `{"self":{"self":{"Items":[]}}}`, `unknown field "self.self.Items"`},
		{"opaque value's keys are not fields", `{"raw":{"Whatever":1},"any":{"ANY":1}}`, ""},
		{"opaque value's key twice", `{"raw":{"a":{"b":1,"b":2}}}`, `duplicate key "raw.a.b"`},
		{"interface value's key twice", `{"any":[{"k":1,"k":1}]}`, `duplicate key "any[0].k"`},
		{"custom unmarshaler's object key twice", `{"opaque":{"a":1,"a":2}}`, `duplicate key "opaque.a"`},
		{"invalid UTF-8 inside an opaque value", "{\"raw\":[\"\xff\"]}", `invalid UTF-8 in "raw[0]"`},
		{"int map keys that are the same number", `{"ints":{"1":"a","01":"b"}}`, `duplicate key "ints.01"`},
		{"int map keys spelled differently", `{"ints":{"1":"a","+1":"b"}}`, `duplicate key`},
		{"unknown key under a type mismatch is still checked", `{"items":{"X":1,"X":2}}`, `duplicate key "items.X"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v shapeOuter
			e := protocol.DecodeRequest([]byte(tt.body), &v)
			switch {
			case tt.want == "" && e != nil:
				t.Fatalf("refused: %v", e)
			case tt.want == "":
				return
			case e == nil:
				t.Fatalf("accepted as %+v; want an error containing %q", v, tt.want)
			case !strings.Contains(e.Message, tt.want):
				t.Fatalf("message %q does not contain %q", e.Message, tt.want)
			}
		})
	}
}

// Stream params (what the agent runs) are held to the same rules.
func TestDecodeParamsRefusesAmbiguousParams(t *testing.T) {
	for _, tt := range []struct{ name, params, want string }{
		{"case", `{"Argv":["echo","case"]}`, `"Argv"`},
		{"argv twice", `{"argv":["echo","first"],"argv":["echo","second"]}`, `duplicate key "argv"`},
		{"env twice", `{"argv":["env"],"env":{"A":"1","A":"2"}}`, `duplicate key "env.A"`},
		{"invalid UTF-8", "{\"argv\":[\"echo\",\"\xff\xfe\"]}", `invalid UTF-8 in "argv[1]"`},
		{"surrogate", `{"argv":["echo","\udfff"]}`, `surrogate`},
		{"trailing data", `{"argv":["echo"]} {"argv":["rm"]}`, `trailing data`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			buf.Write([]byte{protocol.Version, byte(protocol.KindExec), 0, 0, 0, byte(len(tt.params))})
			buf.WriteString(tt.params)
			h, err := protocol.ReadHeader(&buf)
			if err != nil {
				t.Fatal(err)
			}
			var p protocol.ExecParams
			err = h.DecodeParams(&p)
			if err == nil {
				t.Fatalf("accepted as %+v", p)
			}
			if !errors.Is(err, protocol.ErrMalformedJSON) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q: want ErrMalformedJSON containing %q", err, tt.want)
			}
		})
	}
}

// Frames and reports (DecodeJSON) may carry fields a newer peer added, so
// unknown keys are skipped; but a key is never matched to a field by
// another case, no key repeats, and the payload is UTF-8.
func TestDecodeJSONIsTolerantButNeverAmbiguous(t *testing.T) {
	var st protocol.ExitStatus
	if err := protocol.DecodeJSON([]byte(`{"exit_code":3,"added_later":{"x":[1]}}`), &st); err != nil || st.ExitCode != 3 {
		t.Fatalf("DecodeJSON = %+v, %v; want exit_code 3 and the new field skipped", st, err)
	}
	for _, tt := range []struct{ name, payload, want string }{
		{"case", `{"Exit_Code":3}`, `"Exit_Code"`},
		{"twice", `{"exit_code":0,"exit_code":3}`, `duplicate key "exit_code"`},
		{"unknown twice", `{"exit_code":0,"later":1,"later":2}`, `duplicate key "later"`},
		{"invalid UTF-8", "{\"signal\":\"\xff\"}", `invalid UTF-8 in "signal"`},
		{"invalid UTF-8 in a skipped value", "{\"later\":[\"\xff\"]}", `invalid UTF-8 in "later[0]"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var st protocol.ExitStatus
			err := protocol.DecodeJSON([]byte(tt.payload), &st)
			if err == nil {
				t.Fatalf("accepted as %+v", st)
			}
			if !errors.Is(err, protocol.ErrMalformedJSON) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q: want ErrMalformedJSON containing %q", err, tt.want)
			}
		})
	}
}

// A stream request's params are opaque to the coordinator (the agent
// decodes them), but a key in them must not repeat either: the relay must
// not forward what a filter could read two ways.
func TestDecodeStreamRequestParamsAreChecked(t *testing.T) {
	var r protocol.StreamRequest
	body := `{"node":"vm","kind":"exec","params":{"argv":["echo","first"],"argv":["echo","second"]}}`
	e := protocol.DecodeRequest([]byte(body), &r)
	if e == nil || e.Code != protocol.ErrCodeMalformed || !strings.Contains(e.Message, `duplicate key "params.argv"`) {
		t.Fatalf("DecodeRequest = %v, want malformed naming params.argv", e)
	}
	// "\u212a" is the Kelvin sign, which folds to "k": encoding/json alone
	// takes it for "kind".
	body = `{"node":"vm","\u212aind":"exec","params":{"argv":["id"]}}`
	if e := protocol.DecodeRequest([]byte(body), &r); e == nil || e.Code != protocol.ErrCodeUnknownField || !strings.Contains(e.Message, `"kind"`) {
		t.Fatalf("DecodeRequest = %v (kind %q), want unknown_field pointing at kind", e, r.Kind)
	}
}

// Pipe messages are NATS headers, not JSON, but the same rule holds: a
// header given twice, or spelled in another case, is not guessed at.
func TestParsePipeHeaderRefusesAmbiguousHeaders(t *testing.T) {
	for _, tt := range []struct {
		name string
		h    map[string][]string
		body int
		want string
	}{
		{"op twice", map[string][]string{protocol.HeaderPipeOp: {"data", "close"}, protocol.HeaderPipeSeq: {"0"}}, 1, protocol.HeaderPipeOp},
		{"seq twice", map[string][]string{protocol.HeaderPipeOp: {"data"}, protocol.HeaderPipeSeq: {"0", "7"}}, 1, protocol.HeaderPipeSeq},
		{"op in another case beside it", map[string][]string{protocol.HeaderPipeOp: {"data"}, "tether-pipe-op": {"close"}, protocol.HeaderPipeSeq: {"0"}}, 1, "tether-pipe-op"},
		{"credit in another case", map[string][]string{protocol.HeaderPipeOp: {"ack"}, "TETHER-PIPE-CREDIT": {"9999999"}}, 0, "TETHER-PIPE-CREDIT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := protocol.ParsePipeHeader(tt.h, tt.body)
			if err == nil {
				t.Fatalf("accepted as %+v", m)
			}
			if !errors.Is(err, protocol.ErrPipeHeader) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q: want ErrPipeHeader naming %q", err, tt.want)
			}
		})
	}
	// Other headers (NATS's own, tracing) are still ignored.
	m, err := protocol.ParsePipeHeader(map[string][]string{protocol.HeaderPipeOp: {"ping"}, "Traceparent": {"a", "b"}}, 0)
	if err != nil || m.Op != protocol.PipePing {
		t.Fatalf("ping with unrelated headers: %+v, %v", m, err)
	}
}
