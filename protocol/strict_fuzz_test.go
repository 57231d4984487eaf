package protocol_test

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tetherfleet/tether/protocol"
)

// FuzzStrictJSON compares the strict decoders with encoding/json and with
// oracles built independently of them, for the request types and for a
// type of every shape (shapeOuter):
//
//   - what the strict decoder (Header.DecodeParams) accepts, encoding/json
//     accepts too, with the same result, and the text is UTF-8, has no
//     key twice in any object, and every key at a struct position is
//     exactly a field name (the field set taken from json.Marshal itself);
//   - conversely, what passes all of those oracles (and has no surrogate
//     escape) the strict decoder accepts;
//   - re-encoding an accepted value and decoding it again gives the same
//     value;
//   - DecodeJSON (tolerant) accepts whatever the strict decoder accepts,
//     with the same result, and never accepts a text with a repeated key
//     or invalid UTF-8.
//
// Seeds are in testdata/fuzz/FuzzStrictJSON and run as ordinary tests.
func FuzzStrictJSON(f *testing.F) {
	for _, s := range []string{
		`{"target":{"node":"vm"},"argv":["echo","case"],"env":{"A":"1"},"timeout":"30s"}`,
		`{"Target":{"Node":"vm"},"Argv":["echo","case"]}`,
		`{"argv":["echo","first"],"argv":["echo","second"]}`,
		"{\"argv\":[\"\xff\xfe\"]}",
		`{"argv":["\ud800"],"script":"\ud83d\ude00"}`,
		`{"node":"n","kind":"exec","params":{"argv":["x"],"env":{"a":"b"}}}`,
		`{"items":[{"x":1},{"x":2,"y":"b"}],"ptr":{"x":3},"map":{"k":{"x":7}},"e":"e","h":"h","shadow":"s","Untagged":"u","-":"d","opaque":"1s","raw":{"a":[1,{"b":null}]},"any":{"k":[1.5,"s",true]},"ints":{"1":"a"},"self":{"items":[]}}`,
		`{"ints":{"1":"a","01":"b"}}`,
		`{"exit_code":3,"later":{"x":1}}`,
		`{"a":1} {"b":2}`,
		` [] `,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkStrictAgainstJSON[protocol.ExecRequest](t, data)
		checkStrictAgainstJSON[protocol.ExecParams](t, data)
		checkStrictAgainstJSON[protocol.StreamRequest](t, data)
		checkStrictAgainstJSON[protocol.ExitStatus](t, data)
		checkStrictAgainstJSON[shapeOuter](t, data)
		checkStrictAgainstJSON[conflicts](t, data)
	})
}

// conflicts holds the embedding rules' corner cases: a name at equal
// depth in two embedded structs is dropped (X), unless one is tagged (Y);
// a struct embedded twice at one depth contributes nothing (Z); a
// shallower field wins (w). (Untagged, so that vet's structtag check does
// not take the conflicts for mistakes.)
type conflicts struct {
	ConflictA
	ConflictB
	*ConflictC
	twiceA
	twiceB
	W string `json:"w"`
}

type ConflictA struct {
	X string
	Y string
	W int `json:"w"`
}

type ConflictB struct {
	X string
	Y string `json:"Y"`
}

type ConflictC struct {
	C []ConflictA `json:"c"`
}

type twiceA struct{ Twice }
type twiceB struct{ Twice }

type Twice struct {
	Z string
}

// equalDecoded compares decoded values: nil and empty slices and maps are
// equal (omitempty drops an empty one), and raw JSON compares by meaning.
var equalDecoded = cmp.Options{
	cmp.FilterPath(func(p cmp.Path) bool { return p.Last().Type() != rawMessageType }, cmpopts.EquateEmpty()),
	cmp.AllowUnexported(shapeOuter{}, conflicts{}),
	cmp.FilterPath(func(p cmp.Path) bool { return p.Last().Type() == rawMessageType }, cmp.Comparer(func(a, b json.RawMessage) bool {
		// Absent and null are both "no value".
		if len(a) == 0 || string(a) == "null" || len(b) == 0 || string(b) == "null" {
			return (len(a) == 0 || string(a) == "null") == (len(b) == 0 || string(b) == "null")
		}
		var x, y any
		ex, ey := json.Unmarshal(a, &x), json.Unmarshal(b, &y)
		if ex != nil || ey != nil {
			return bytes.Equal(a, b)
		}
		return reflect.DeepEqual(x, y)
	})),
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// surrogateEscape finds \u escapes of UTF-16 surrogates (paired or not);
// the converse check skips texts with any.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89abcdefABCDEF]`)

func strictDecode(data []byte, v any) error {
	return protocol.Header{Kind: protocol.KindExec, Params: data}.DecodeParams(v)
}

func checkStrictAgainstJSON[T any](t *testing.T, data []byte) {
	t.Helper()
	var got T
	strictErr := strictDecode(data, &got)

	var ref T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	refErr := dec.Decode(&ref)
	if refErr == nil {
		if _, err := dec.Token(); err != io.EOF {
			refErr = errors.New("trailing data")
		}
	}
	clean := utf8.Valid(data) && !hasDuplicateKey(data)
	exact := refErr == nil && clean && exactKeys(reflect.TypeFor[T](), data)

	if strictErr == nil {
		switch {
		case refErr != nil:
			t.Fatalf("%T: strict accepted what encoding/json refuses (%v): %q", got, refErr, data)
		case !utf8.Valid(data):
			t.Fatalf("%T: strict accepted invalid UTF-8: %q", got, data)
		case hasDuplicateKey(data):
			t.Fatalf("%T: strict accepted a repeated key: %q", got, data)
		case !exact:
			t.Fatalf("%T: strict accepted a key that is not exactly a field name: %q", got, data)
		}
		if diff := cmp.Diff(ref, got, equalDecoded); diff != "" {
			t.Fatalf("%T: strict and encoding/json decode %q differently (-json +strict):\n%s", got, data, diff)
		}
		// Re-encoded, it decodes strictly to the same value.
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("%T: Marshal of an accepted value: %v", got, err)
		}
		var again T
		if err := strictDecode(b, &again); err != nil {
			t.Fatalf("%T: re-encoded %q refused: %v", got, b, err)
		}
		if diff := cmp.Diff(got, again, equalDecoded); diff != "" {
			t.Fatalf("%T: round trip through %q changed the value (-first +again):\n%s", got, b, diff)
		}
		// The tolerant decoder accepts it too, the same way.
		var tol T
		if err := protocol.DecodeJSON(data, &tol); err != nil {
			t.Fatalf("%T: DecodeJSON refused what the strict decoder accepts: %v", got, err)
		}
		if diff := cmp.Diff(got, tol, equalDecoded); diff != "" {
			t.Fatalf("%T: DecodeJSON decodes %q differently (-strict +tolerant):\n%s", got, data, diff)
		}
		return
	}
	if exact && !surrogateEscape.Match(data) {
		t.Fatalf("%T: strict refused a clean text %q: %v", got, data, strictErr)
	}
	if !errors.Is(strictErr, protocol.ErrMalformedJSON) {
		t.Fatalf("%T: error does not wrap ErrMalformedJSON: %v", got, strictErr)
	}
	var tol T
	if protocol.DecodeJSON(data, &tol) == nil && !clean {
		t.Fatalf("%T: DecodeJSON accepted a repeated key or invalid UTF-8: %q", got, data)
	}
}

// hasDuplicateKey reports whether any object in the JSON text data has a
// key twice (after unescaping), using encoding/json's tokenizer. It is
// only asked about texts encoding/json accepts or that are UTF-8; a
// tokenizer error counts as no duplicate found.
func hasDuplicateKey(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys    map[string]bool
		object  bool
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return true
				}
				top.keys[k] = true
				top.wantKey = false
				continue
			}
		}
		if top != nil && top.object {
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, object: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
		}
	}
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func customDecoded(t reflect.Type) bool {
	return t.Implements(unmarshalerType) || t.Implements(textUnmarshalerType) ||
		reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType)
}

// exactKeys reports whether every key of data at a position where t has a
// struct is exactly one of the names json.Marshal gives that struct's
// fields. data is a text encoding/json accepts into t.
func exactKeys(t reflect.Type, data []byte) bool {
	var v any
	if json.Unmarshal(data, &v) != nil {
		return false
	}
	return exactKeysIn(t, v)
}

func exactKeysIn(t reflect.Type, v any) bool {
	if v == nil || customDecoded(t) {
		return true
	}
	switch t.Kind() {
	case reflect.Pointer:
		return exactKeysIn(t.Elem(), v)
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return true
		}
		fields := marshalledFields(t)
		for k, x := range m {
			ft, ok := fields[k]
			if !ok || !exactKeysIn(ft, x) {
				return false
			}
		}
	case reflect.Slice, reflect.Array:
		if a, ok := v.([]any); ok {
			for _, x := range a {
				if !exactKeysIn(t.Elem(), x) {
					return false
				}
			}
		}
	case reflect.Map:
		if m, ok := v.(map[string]any); ok {
			// Integer keys spelled differently ("1", "01") are one key.
			ints := map[int64]bool{}
			for k, x := range m {
				if kk := t.Key().Kind(); kk >= reflect.Int && kk <= reflect.Int64 {
					n, err := strconv.ParseInt(k, 10, 64)
					if err == nil && ints[n] {
						return false
					}
					ints[n] = true
				}
				if !exactKeysIn(t.Elem(), x) {
					return false
				}
			}
		}
	}
	return true
}

// marshalledFields returns the JSON names of struct type t's fields as
// json.Marshal writes them for a value with every field set (so the
// embedding and conflict rules are encoding/json's own), each with the
// type of the shallowest visible Go field of that name.
func marshalledFields(t reflect.Type) map[string]reflect.Type {
	v := reflect.New(t).Elem()
	fill(v, 0)
	b, err := json.Marshal(v.Interface())
	if err != nil {
		panic(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	out := map[string]reflect.Type{}
	for name := range m {
		depth := -1
		for _, sf := range allFields(t, 0) {
			tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			n := tag
			if n == "" {
				n = sf.Name
			}
			if n == name && (depth < 0 || len(sf.Index) < depth) && (sf.IsExported() || tag != "") {
				out[name], depth = sf.Type, len(sf.Index)
			}
		}
	}
	return out
}

// allFields lists the fields of struct type t and of the structs it
// embeds, ambiguous ones included (reflect.VisibleFields leaves those
// out), with Index giving their depth.
func allFields(t reflect.Type, depth int) []reflect.StructField {
	var out []reflect.StructField
	for i := range t.NumField() {
		sf := t.Field(i)
		sf.Index = make([]int, depth+1)
		out = append(out, sf)
		et := sf.Type
		if et.Kind() == reflect.Pointer {
			et = et.Elem()
		}
		if sf.Anonymous && et.Kind() == reflect.Struct && depth < 4 {
			out = append(out, allFields(et, depth+1)...)
		}
	}
	return out
}

// fill sets every settable field of v to a non-zero value, two pointers
// deep.
func fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), depth)
		}
		return
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), depth)
		}
		return
	}
	if !v.CanSet() {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if depth < 2 {
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem(), depth+1)
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte("1"))
			return
		}
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		fill(k, depth)
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e, depth)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Interface:
		if v.NumMethod() == 0 {
			v.Set(reflect.ValueOf("x"))
		}
	}
}

// The strict decoder's field set is encoding/json's, for the corner cases
// of embedding: each name json.Marshal writes is accepted, in exactly that
// case, and nothing else is.
func TestStrictFieldSetsMatchEncodingJSON(t *testing.T) {
	for _, typ := range []reflect.Type{
		reflect.TypeFor[conflicts](),
		reflect.TypeFor[shapeOuter](),
		// Every type production code decodes strictly or reads from a
		// frame.
		reflect.TypeFor[protocol.ExecRequest](),
		reflect.TypeFor[protocol.StreamRequest](),
		reflect.TypeFor[protocol.NodesRequest](),
		reflect.TypeFor[protocol.CancelRequest](),
		reflect.TypeFor[protocol.JobRequest](),
		reflect.TypeFor[protocol.JobOutputRequest](),
		reflect.TypeFor[protocol.LeaseOpenRequest](),
		reflect.TypeFor[protocol.LeaseRequest](),
		reflect.TypeFor[protocol.SandboxesListRequest](),
		reflect.TypeFor[protocol.SandboxRegisterRequest](),
		reflect.TypeFor[protocol.ReapRequest](),
		reflect.TypeFor[protocol.ControlParams](),
		reflect.TypeFor[protocol.CopyParams](),
		reflect.TypeFor[protocol.ExecParams](),
		reflect.TypeFor[protocol.InventoryParams](),
		reflect.TypeFor[protocol.DialParams](),
		reflect.TypeFor[protocol.SandboxOpParams](),
		reflect.TypeFor[protocol.JobParams](),
		reflect.TypeFor[protocol.PTYParams](),
		reflect.TypeFor[protocol.Hello](),
		reflect.TypeFor[protocol.Welcome](),
		reflect.TypeFor[protocol.Heartbeat](),
		reflect.TypeFor[protocol.ExitStatus](),
		reflect.TypeFor[protocol.ErrorInfo](),
	} {
		fields := marshalledFields(typ)
		probe := func(key string) error {
			v := reflect.New(typ)
			b, _ := json.Marshal(map[string]any{key: nil})
			return strictDecode(b, v.Interface())
		}
		for name := range fields {
			if err := probe(name); err != nil {
				t.Errorf("%v: field %q refused: %v", typ, name, err)
			}
			for _, other := range []string{strings.ToUpper(name), strings.ToLower(name), strings.ToUpper(name[:1]) + name[1:]} {
				if _, ok := fields[other]; !ok && other != name {
					if err := probe(other); err == nil {
						t.Errorf("%v: %q accepted as field %q", typ, other, name)
					}
				}
			}
		}
	}
	// The conflicting names are not fields.
	for _, name := range []string{"X", "x", "Z", "z", "Twice", "ConflictA", "C"} {
		var c conflicts
		if err := strictDecode([]byte(`{"`+name+`":null}`), &c); err == nil {
			t.Errorf("conflicts: %q accepted", name)
		}
	}
	if got := marshalledFields(reflect.TypeFor[conflicts]()); len(got) != 3 || got["Y"] == nil || got["w"] == nil || got["c"] == nil {
		t.Errorf("oracle: conflicts has fields %v, want Y, w, c", got)
	}
}
