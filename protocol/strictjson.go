package protocol

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Strict JSON
//
// encoding/json (v1) resolves three ambiguities silently: it matches an
// object key to a struct field ignoring case (even with
// DisallowUnknownFields, and with Unicode folding: "ſcript" is "script"),
// it lets the last of two equal keys win, and it replaces invalid UTF-8 and
// unpaired UTF-16 surrogate escapes with U+FFFD. A filter that reads a body
// (an authorization policy, a proxy, a NATS-level inspector) can then see
// another request than the one that runs. Every decoder of untrusted JSON
// in this package (DecodeRequest, Header.DecodeParams, DecodeJSON) first
// runs checkJSON, which walks the bytes once against the target type's
// shape and refuses:
//
//   - a key that is not exactly, case-sensitively, one of the struct's JSON
//     field names (ProblemFieldCase when it differs only by case,
//     ProblemUnknownField otherwise; in tolerant mode, DecodeJSON, unknown
//     keys are skipped but a case variant of a field is still refused);
//   - a key given twice in one object, at any depth, after unescaping:
//     struct fields, map keys (env), and objects inside opaque values
//     (json.RawMessage, interfaces, types with their own UnmarshalJSON);
//     int-keyed maps compare the numbers ("1" and "01" are the same key);
//   - bytes that are not UTF-8 (RFC 8259 §8.1), anywhere in the text;
//   - a \uXXXX escape of a UTF-16 surrogate that is not the first half of
//     a pair followed by its second half: such a string has no Unicode
//     reading (RFC 8259 §8.2 leaves it unpredictable; encoding/json makes
//     it U+FFFD), so it is refused like invalid UTF-8;
//   - data after the value (strict mode).
//
// Only then does encoding/json decode the bytes, which it now reads the one
// way a filter does. Types with their own UnmarshalJSON or UnmarshalText
// are opaque leaves: their keys are not checked against fields (the type
// decides), but their text is still checked for UTF-8 and repeated keys.
// Syntax errors are reported by encoding/json's own messages.
//
// The shape of each Go type is computed once, by the same embedding and
// tag rules encoding/json applies (promoted fields, shadowing, "-",
// untagged fields named by their Go names), and cached.

// JSONProblem says what a JSONError found.
type JSONProblem uint8

// JSON problems found by the strict decoders.
const (
	// ProblemUnknownField: a key that is not a field name of the object's
	// struct.
	ProblemUnknownField JSONProblem = iota + 1
	// ProblemFieldCase: a key that matches a field name only when case is
	// ignored; JSONError.Detail is the field's name.
	ProblemFieldCase
	// ProblemDuplicateKey: a key given twice in one object.
	ProblemDuplicateKey
	// ProblemInvalidUTF8: bytes that are not UTF-8.
	ProblemInvalidUTF8
	// ProblemSurrogate: a \uXXXX escape of an unpaired UTF-16 surrogate;
	// JSONError.Detail is the escape.
	ProblemSurrogate
)

// JSONError is a JSON text the strict decoders refused although it may be
// well-formed JSON. It names where the problem is and what it is.
type JSONError struct {
	// Path is the JSON path of the offending key or value: "argv",
	// "target.node", "argv[1]", "env.A", `env["a.b"]`; "" is the top-level
	// value.
	Path string
	// Offset is the byte offset in the input where the problem starts.
	Offset int
	// Problem is what is wrong.
	Problem JSONProblem
	// Detail is the field name meant (ProblemFieldCase) or the escape
	// (ProblemSurrogate); "" otherwise.
	Detail string
	// inKey is set when an invalid byte or escape is in a key of the object
	// at Path rather than in the value at Path.
	inKey bool
}

// Error reads as the object of "request has ...": `unknown field "argv"`,
// `duplicate key "env.A"`, `invalid UTF-8 in "argv[1]" at byte offset 40`.
func (e *JSONError) Error() string {
	where := ""
	if e.Path != "" {
		where = " " + Clip(e.Path)
	}
	if e.inKey {
		if e.Path == "" {
			where = " an object key"
		} else {
			where = " a key of" + where
		}
	}
	switch e.Problem {
	case ProblemUnknownField:
		return "unknown field" + where
	case ProblemFieldCase:
		return fmt.Sprintf("unknown field%s (field names are case-sensitive: the field is %s)", where, Clip(e.Detail))
	case ProblemDuplicateKey:
		return "duplicate key" + where
	case ProblemInvalidUTF8:
		if where != "" {
			where = " in" + where
		}
		return fmt.Sprintf("invalid UTF-8%s at byte offset %d", where, e.Offset)
	case ProblemSurrogate:
		if where != "" {
			where = " in" + where
		}
		return fmt.Sprintf("unpaired UTF-16 surrogate %s%s at byte offset %d (a string must be Unicode text)", e.Detail, where, e.Offset)
	}
	return "invalid JSON" + where
}

// under prefixes e.Path with an object key or an array index segment.
func (e *JSONError) under(seg string) {
	switch {
	case e.Path == "":
		e.Path = seg
	case e.Path[0] == '[':
		e.Path = seg + e.Path
	default:
		e.Path = seg + "." + e.Path
	}
}

// keySegment renders an object key as a path segment: the key itself when
// it is a plain name (letters, digits, '_', '-'), else ["quoted"].
func keySegment(k []byte) string {
	plain := len(k) > 0
	for _, r := range string(k) {
		if !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-') {
			plain = false
			break
		}
	}
	if plain {
		return string(k)
	}
	return "[" + strconv.Quote(string(k)) + "]"
}

// jsonSyntaxError is a walker finding that encoding/json is asked to word
// (see checkJSON).
type jsonSyntaxError struct {
	msg string
	off int
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("%s at byte offset %d", e.msg, e.off)
}

// decodeStrict decodes one JSON value b into v (a non-nil pointer),
// refusing what checkJSON refuses, unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	if err := checkJSON(b, v, false); err != nil {
		return err
	}
	// DisallowUnknownFields repeats the walker's field check (the walker's
	// is exact, this one folds case): a second net, should their field
	// rules ever differ.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// decodeTolerant decodes one JSON value b into v, refusing what checkJSON
// refuses in tolerant mode: unknown keys are skipped.
func decodeTolerant(b []byte, v any) error {
	if err := checkJSON(b, v, true); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// checkJSON walks b against the shape of the type v points to. It returns
// a *JSONError for what it refuses; for a syntax error, encoding/json's own
// error, or the walker's when encoding/json would accept the text (only
// trailing data after a value, which json.Decoder stops before).
func checkJSON(b []byte, v any, tolerant bool) error {
	rt := reflect.TypeOf(v)
	if rt == nil || rt.Kind() != reflect.Pointer {
		// encoding/json words this one (InvalidUnmarshalError).
		return json.Unmarshal(b, v)
	}
	w := walker{data: b, tolerant: tolerant}
	err := w.value(schemaOf(rt.Elem()))
	if err == nil {
		w.space()
		if w.pos < len(w.data) {
			if je := w.utf8At(w.pos); je != nil {
				return je
			}
			return &jsonSyntaxError{"trailing data after JSON value", w.pos}
		}
		return nil
	}
	if se, ok := err.(*jsonSyntaxError); ok {
		if jerr := json.Unmarshal(b, new(any)); jerr != nil {
			return jerr
		}
		return se
	}
	return err
}

// Shapes.

type shapeKind uint8

const (
	shapeAny    shapeKind = iota // any value: checked for UTF-8 and repeated keys only
	shapeStruct                  // keys are exactly the fields' names
	shapeMap                     // keys are data; values have elem's shape
	shapeArray                   // elements have elem's shape
)

// mapKeyKind says how two keys of a map compare.
type mapKeyKind uint8

const (
	keyText mapKeyKind = iota // as unescaped strings
	keyInt                    // as the integers they parse to
	keyUint                   // as the unsigned integers they parse to
)

// shape is what the walker knows of a Go type. Shapes are immutable once
// cached.
type shape struct {
	kind   shapeKind
	fields []shapeField   // shapeStruct
	index  map[string]int // shapeStruct: field name → fields index
	elem   *shape         // shapeMap, shapeArray
	key    mapKeyKind     // shapeMap
}

type shapeField struct {
	name  string
	shape *shape
}

var anyShape = &shape{kind: shapeAny}

// shapes caches *shape by reflect.Type.
var shapes sync.Map

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// schemaOf returns the cached shape of t, computing it (and the shapes of
// the types it contains) on first use.
func schemaOf(t reflect.Type) *shape {
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	b := shapeBuilder{seen: map[reflect.Type]*shape{}}
	s := b.build(t)
	for typ, ts := range b.seen {
		shapes.LoadOrStore(typ, ts)
	}
	return s
}

type shapeBuilder struct {
	seen map[reflect.Type]*shape // shapes built in this run, possibly incomplete
}

// opaque reports whether encoding/json hands values of t to the type's own
// UnmarshalJSON or UnmarshalText.
func opaque(t reflect.Type) bool {
	if t.Implements(jsonUnmarshalerType) || t.Implements(textUnmarshalerType) {
		return true
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface {
		pt := reflect.PointerTo(t)
		return pt.Implements(jsonUnmarshalerType) || pt.Implements(textUnmarshalerType)
	}
	return false
}

func (b *shapeBuilder) build(t reflect.Type) *shape {
	if s, ok := b.seen[t]; ok {
		return s
	}
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	if opaque(t) {
		return anyShape
	}
	switch t.Kind() {
	case reflect.Pointer:
		// A pointer has its target's shape (and shares its node, which
		// is what makes recursive types terminate).
		return b.build(t.Elem())
	case reflect.Struct:
		s := &shape{kind: shapeStruct}
		b.seen[t] = s
		fs := jsonFields(t)
		s.fields = make([]shapeField, len(fs))
		s.index = make(map[string]int, len(fs))
		for i, f := range fs {
			s.index[f.name] = i
			s.fields[i] = shapeField{name: f.name}
		}
		for i, f := range fs {
			s.fields[i].shape = b.build(f.typ)
		}
		return s
	case reflect.Map:
		s := &shape{kind: shapeMap}
		b.seen[t] = s
		kt := t.Key()
		switch {
		case reflect.PointerTo(kt).Implements(textUnmarshalerType):
			s.key = keyText
		case kt.Kind() >= reflect.Int && kt.Kind() <= reflect.Int64:
			s.key = keyInt
		case kt.Kind() >= reflect.Uint && kt.Kind() <= reflect.Uintptr:
			s.key = keyUint
		}
		s.elem = b.build(t.Elem())
		return s
	case reflect.Slice, reflect.Array:
		s := &shape{kind: shapeArray}
		b.seen[t] = s
		s.elem = b.build(t.Elem())
		return s
	}
	return anyShape
}

// jsonField is one field encoding/json decodes into.
type jsonField struct {
	name   string
	tagged bool
	depth  int
	typ    reflect.Type
}

// jsonFields lists the fields encoding/json matches keys to for struct
// type t: exported fields and the fields promoted from embedded structs,
// named by their tag or Go name, where a shallower field hides a deeper one
// of the same name and, at equal depth, a single tagged field wins and
// otherwise the name is dropped.
func jsonFields(t reflect.Type) []jsonField {
	var found []jsonField
	level := []reflect.Type{t}
	times := map[reflect.Type]int{t: 1} // how often each type of level is embedded at this depth
	visited := map[reflect.Type]bool{}
	for depth := 0; len(level) > 0; depth++ {
		var next []reflect.Type
		nextTimes := map[reflect.Type]int{}
		for _, st := range level {
			if visited[st] {
				continue
			}
			visited[st] = true
			for i := range st.NumField() {
				sf := st.Field(i)
				if sf.Anonymous {
					et := sf.Type
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if !sf.IsExported() && et.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				if !validFieldName(name) {
					name = ""
				}
				ft := sf.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if name == "" && sf.Anonymous && ft.Kind() == reflect.Struct {
					// An untagged embedded struct: its fields are promoted.
					nextTimes[ft]++
					if nextTimes[ft] == 1 {
						next = append(next, ft)
					}
					continue
				}
				f := jsonField{name: name, tagged: name != "", depth: depth, typ: sf.Type}
				if f.name == "" {
					f.name = sf.Name
				}
				found = append(found, f)
				if times[st] > 1 {
					// The same struct embedded twice at one depth: its
					// fields are ambiguous, like two fields of one name.
					found = append(found, f)
				}
			}
		}
		level, times = next, nextTimes
	}

	// Keep, per name, the one dominant field, in first-seen order.
	byName := map[string][]int{}
	var names []string
	for i, f := range found {
		if _, ok := byName[f.name]; !ok {
			names = append(names, f.name)
		}
		byName[f.name] = append(byName[f.name], i)
	}
	var out []jsonField
	for _, n := range names {
		idx := byName[n]
		minDepth := found[idx[0]].depth
		for _, i := range idx {
			minDepth = min(minDepth, found[i].depth)
		}
		var top, tagged []int
		for _, i := range idx {
			if found[i].depth == minDepth {
				top = append(top, i)
				if found[i].tagged {
					tagged = append(tagged, i)
				}
			}
		}
		switch {
		case len(top) == 1:
			out = append(out, found[top[0]])
		case len(tagged) == 1:
			out = append(out, found[tagged[0]])
		}
	}
	return out
}

// validFieldName reports whether encoding/json takes s, from a tag, as a
// field name: letters, digits and punctuation other than quotes, backslash
// and comma.
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}

// The walker.

// maxJSONDepth bounds nesting, as encoding/json does (it refuses deeper
// texts, so the walker need not go further).
const maxJSONDepth = 10000

// plainString marks the bytes a string may hold without a closer look:
// ASCII from space up, except '"' and '\\'.
var plainString = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

type walker struct {
	data     []byte
	pos      int
	depth    int
	tolerant bool // skip unknown keys instead of refusing them
}

func (w *walker) space() {
	for w.pos < len(w.data) {
		switch w.data[w.pos] {
		case ' ', '\t', '\n', '\r':
			w.pos++
		default:
			return
		}
	}
}

// syntax reports a syntax error at the current position; a non-ASCII byte
// there that does not start UTF-8 is reported as invalid UTF-8 instead.
func (w *walker) syntax(msg string) error {
	if je := w.utf8At(w.pos); je != nil {
		return je
	}
	return &jsonSyntaxError{msg, w.pos}
}

// utf8At returns an invalid UTF-8 error if the bytes at i are not UTF-8.
func (w *walker) utf8At(i int) *JSONError {
	if i < len(w.data) && w.data[i] >= utf8.RuneSelf {
		if r, n := utf8.DecodeRune(w.data[i:]); r == utf8.RuneError && n == 1 {
			return &JSONError{Problem: ProblemInvalidUTF8, Offset: i}
		}
	}
	return nil
}

// value checks one value of shape s at w.pos.
func (w *walker) value(s *shape) error {
	w.space()
	if w.pos >= len(w.data) {
		return w.syntax("unexpected end of JSON input")
	}
	switch c := w.data[w.pos]; {
	case c == '{':
		return w.object(s)
	case c == '[':
		return w.array(s)
	case c == '"':
		_, _, _, err := w.str()
		return err
	case c == 't':
		return w.literal("true")
	case c == 'f':
		return w.literal("false")
	case c == 'n':
		return w.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return w.number()
	}
	return w.syntax("invalid character looking for the beginning of a value")
}

func (w *walker) literal(lit string) error {
	if !bytes.HasPrefix(w.data[w.pos:], []byte(lit)) {
		return w.syntax("invalid literal")
	}
	w.pos += len(lit)
	return nil
}

// number checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (w *walker) number() error {
	d, i := w.data, w.pos
	digits := func() bool {
		start := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		w.pos = i
		return w.syntax("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			w.pos = i
			return w.syntax("invalid number")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			w.pos = i
			return w.syntax("invalid number")
		}
	}
	w.pos = i
	return nil
}

// str checks the string at w.pos (its opening quote) and returns the
// bounds of its contents and whether it has escapes.
func (w *walker) str() (start, end int, escaped bool, err error) {
	d := w.data
	i := w.pos + 1
	start = i
	for {
		for i < len(d) && plainString[d[i]] {
			i++
		}
		if i >= len(d) {
			w.pos = i
			return 0, 0, false, w.syntax("unexpected end of JSON input")
		}
		switch c := d[i]; {
		case c == '"':
			w.pos = i + 1
			return start, i, escaped, nil
		case c == '\\':
			escaped = true
			n, err := w.escape(i)
			if err != nil {
				return 0, 0, false, err
			}
			i += n
		case c < 0x20:
			w.pos = i
			return 0, 0, false, w.syntax("invalid control character in string")
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return 0, 0, false, &JSONError{Problem: ProblemInvalidUTF8, Offset: i}
			}
			i += n
		}
	}
}

// escape checks the escape at d[i] ('\\') and returns its length.
func (w *walker) escape(i int) (int, error) {
	d := w.data
	if i+1 >= len(d) {
		w.pos = len(d)
		return 0, w.syntax("unexpected end of JSON input")
	}
	switch d[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
	default:
		w.pos = i + 1
		return 0, w.syntax("invalid escape in string")
	}
	r, ok := hex4(d, i+2)
	if !ok {
		w.pos = i + 2
		return 0, w.syntax("invalid \\u escape in string")
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, &JSONError{Problem: ProblemSurrogate, Offset: i, Detail: string(d[i : i+6])}
	case r >= 0xD800 && r <= 0xDBFF:
		if i+7 < len(d) && d[i+6] == '\\' && d[i+7] == 'u' {
			if r2, ok := hex4(d, i+8); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
				return 12, nil
			}
		}
		return 0, &JSONError{Problem: ProblemSurrogate, Offset: i, Detail: string(d[i : i+6])}
	}
	return 6, nil
}

// hex4 parses the 4 hex digits at d[i:].
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// unescape returns the decoded contents of a string the walker checked.
func unescape(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _ := hex4(s, i+2)
			if r >= 0xD800 && r <= 0xDBFF {
				r2, _ := hex4(s, i+8)
				out = utf8.AppendRune(out, (r-0xD800)<<10|(r2-0xDC00)+0x10000)
				i += 12
				continue
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			out = append(out, s[i+1])
		}
		i += 2
	}
	return out
}

// keySet finds repeated keys of one object: a few in place, more in a map.
type keySet struct {
	few [8][]byte
	n   int
	m   map[string]struct{}
}

// add records k and reports whether it was there already.
func (ks *keySet) add(k []byte) bool {
	if ks.m != nil {
		if _, ok := ks.m[string(k)]; ok {
			return true
		}
		ks.m[string(k)] = struct{}{}
		return false
	}
	for _, o := range ks.few[:ks.n] {
		if bytes.Equal(o, k) {
			return true
		}
	}
	if ks.n < len(ks.few) {
		ks.few[ks.n] = k
		ks.n++
		return false
	}
	ks.m = make(map[string]struct{}, 2*len(ks.few))
	for _, o := range ks.few {
		ks.m[string(o)] = struct{}{}
	}
	ks.m[string(k)] = struct{}{}
	return false
}

// mapKey returns the form in which keys of a map with key kind kk are
// compared: the number for integer keys (when it parses; encoding/json
// refuses it otherwise), else the text.
func mapKey(kk mapKeyKind, k []byte) []byte {
	switch kk {
	case keyInt:
		if n, err := strconv.ParseInt(string(k), 10, 64); err == nil {
			return strconv.AppendInt(nil, n, 10)
		}
	case keyUint:
		if n, err := strconv.ParseUint(string(k), 10, 64); err == nil {
			return strconv.AppendUint(nil, n, 10)
		}
	}
	return k
}

// object checks the object at w.pos (its '{') against s.
func (w *walker) object(s *shape) error {
	if w.depth++; w.depth > maxJSONDepth {
		return w.syntax("exceeded max depth")
	}
	w.pos++
	var (
		seen  uint64 // struct fields seen, by index, when there are at most 64
		keys  keySet // other keys seen (maps, opaque values, unknown or many fields)
		field = s.kind == shapeStruct && len(s.fields) <= 64
	)
	w.space()
	if w.pos < len(w.data) && w.data[w.pos] == '}' {
		w.pos++
		w.depth--
		return nil
	}
	for {
		w.space()
		if w.pos >= len(w.data) || w.data[w.pos] != '"' {
			return w.syntax("expected a string as object key")
		}
		keyAt := w.pos
		ks, ke, esc, err := w.str()
		if err != nil {
			if je, ok := err.(*JSONError); ok {
				je.inKey = true
			}
			return err
		}
		key := w.data[ks:ke]
		if esc {
			key = unescape(key)
		}
		w.space()
		if w.pos >= len(w.data) || w.data[w.pos] != ':' {
			return w.syntax("expected ':' after object key")
		}
		w.pos++

		child := anyShape
		switch s.kind {
		case shapeStruct:
			i, ok := s.index[string(key)]
			if ok {
				child = s.fields[i].shape
				if field {
					if seen&(1<<i) != 0 {
						return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemDuplicateKey}
					}
					seen |= 1 << i
					break
				}
			} else {
				for _, f := range s.fields {
					if bytes.EqualFold(key, []byte(f.name)) {
						return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemFieldCase, Detail: f.name}
					}
				}
				if !w.tolerant {
					return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemUnknownField}
				}
			}
			if keys.add(key) {
				return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemDuplicateKey}
			}
		case shapeMap:
			child = s.elem
			if keys.add(mapKey(s.key, key)) {
				return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemDuplicateKey}
			}
		default:
			if keys.add(key) {
				return &JSONError{Path: keySegment(key), Offset: keyAt, Problem: ProblemDuplicateKey}
			}
		}

		if err := w.value(child); err != nil {
			if je, ok := err.(*JSONError); ok {
				je.under(keySegment(key))
			}
			return err
		}
		w.space()
		if w.pos >= len(w.data) {
			return w.syntax("unexpected end of JSON input")
		}
		switch w.data[w.pos] {
		case ',':
			w.pos++
		case '}':
			w.pos++
			w.depth--
			return nil
		default:
			return w.syntax("expected ',' or '}' after object value")
		}
	}
}

// array checks the array at w.pos (its '[') against s.
func (w *walker) array(s *shape) error {
	if w.depth++; w.depth > maxJSONDepth {
		return w.syntax("exceeded max depth")
	}
	w.pos++
	elem := anyShape
	if s.kind == shapeArray {
		elem = s.elem
	}
	w.space()
	if w.pos < len(w.data) && w.data[w.pos] == ']' {
		w.pos++
		w.depth--
		return nil
	}
	for i := 0; ; i++ {
		if err := w.value(elem); err != nil {
			if je, ok := err.(*JSONError); ok {
				je.under("[" + strconv.Itoa(i) + "]")
			}
			return err
		}
		w.space()
		if w.pos >= len(w.data) {
			return w.syntax("unexpected end of JSON input")
		}
		switch w.data[w.pos] {
		case ',':
			w.pos++
		case ']':
			w.pos++
			w.depth--
			return nil
		default:
			return w.syntax("expected ',' or ']' after array element")
		}
	}
}
