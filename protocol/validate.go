package protocol

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Shared checks of the stream params the agent turns into processes (exec,
// pty). Each params type's Validate is the one rule set for its kind: the
// agent runs it on every header it reads, and the coordinator runs the same
// method on what it derives from a NATS request (ExecRequest.Validate goes
// through ExecParams.Validate), so the two never disagree about what runs.

// MaxTimeoutMS bounds ExecParams.TimeoutMS: 2^62 ns (about 146 years), the
// largest timeout ExecRequest.Timeout decodes, so that the agent's and the
// coordinator's time.Duration arithmetic on it cannot overflow.
const MaxTimeoutMS = int64(1<<62) / int64(time.Millisecond)

// sizeError is a validation problem of size: ExecRequest.Validate reports
// it as 413 too_large. It matches ErrTooLarge.
type sizeError struct{ msg string }

func (e *sizeError) Error() string { return e.msg }
func (e *sizeError) Unwrap() error { return ErrTooLarge }

func tooLarge(format string, args ...any) error {
	return &sizeError{msg: fmt.Sprintf(format, args...)}
}

// checkArgs checks a list that becomes C strings of a process (arguments
// or, with emptyOK false, commands that must each run something): at most
// MaxArgs entries, no NUL. Only the first bad entry of each kind is named,
// so a long list cannot blow up the message.
func checkArgs(name string, args []string, emptyOK bool) []error {
	if len(args) > MaxArgs {
		return []error{tooLarge("%s has %d entries, over the limit of %d", name, len(args), MaxArgs)}
	}
	var errs []error
	empty, nul := -1, -1
	for i, a := range args {
		if a == "" && empty < 0 && !emptyOK {
			empty = i
		}
		if nul < 0 && strings.IndexByte(a, 0) >= 0 {
			nul = i
		}
	}
	if empty >= 0 {
		errs = append(errs, fmt.Errorf("%s[%d] is empty: an empty command runs nothing; leave it out", name, empty))
	}
	if nul >= 0 {
		errs = append(errs, fmt.Errorf("%s[%d] contains NUL", name, nul))
	}
	return errs
}

// checkEnv checks variables added to a process's environment: at most
// MaxEnv, keys non-empty without '=' or NUL, values without NUL.
func checkEnv(env map[string]string) []error {
	if len(env) > MaxEnv {
		return []error{tooLarge("env has %d entries, over the limit of %d", len(env), MaxEnv)}
	}
	var errs []error
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			errs = append(errs, fmt.Errorf("env key %s is invalid (empty, or contains '=' or NUL)", Clip(k)))
		} else if err := CheckEnvName(k); err != nil {
			errs = append(errs, err)
		} else if strings.IndexByte(v, 0) >= 0 {
			errs = append(errs, fmt.Errorf("env %s: value contains NUL", Clip(k)))
		}
	}
	return errs
}

// CheckEnvName refuses an environment variable name holding a space or a
// control character (C0, DEL), naming it and its 1-based byte: no shell
// can read such a name, and it would carry escapes into logs and
// listings. Other names outside the shell's [A-Za-z_][A-Za-z0-9_]*
// (npm_config_a-b) pass; empty names and '=' are checkEnv's.
func CheckEnvName(k string) error {
	if i := strings.IndexFunc(k, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return fmt.Errorf("env name %s: %s at byte %d (a space or a control; a name a shell reads is letters, digits and _)", QuoteName(k), CharAt(k, i), i+1)
	}
	return nil
}

// checkNoNUL reports a field that becomes a C string (a path, an
// environment value) and contains NUL.
func checkNoNUL(name, v string) []error {
	if strings.IndexByte(v, 0) >= 0 {
		return []error{fmt.Errorf("%s contains NUL", name)}
	}
	return nil
}

// sizeErrors returns the problems of err (a Validate result, possibly
// joined) that are about size, or nil if none is.
func sizeErrors(err error) []error {
	var all []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		all = j.Unwrap()
	} else {
		all = []error{err}
	}
	var out []error
	for _, e := range all {
		if errors.Is(e, ErrTooLarge) {
			out = append(out, e)
		}
	}
	return out
}

// CheckStreamParams checks params as the agent checks the header of a
// stream of kind k before it serves it: decoded strictly into the kind's
// params struct (Header.DecodeParams: unknown fields and trailing data are
// errors), then, for exec, pty and copy, the struct's Validate; a dial's
// target is the node's to judge (its allow-list), so dial params are only
// decoded. Whoever passes params on to an agent (the coordinator's
// SubjectStream relay) calls it to refuse what the agent would, with the
// same words. The error matches ErrMalformedJSON for params that do not
// decode, and ErrTooLarge when a problem is one of size; kinds other than
// these four return an error matching ErrUnknownKind.
func CheckStreamParams(k Kind, params []byte) error {
	h := Header{Version: Version, Kind: k, Params: params}
	var v interface{ Validate() error }
	switch k {
	case KindExec:
		v = &ExecParams{}
	case KindPTY:
		v = &PTYParams{}
	case KindCopy:
		v = &CopyParams{}
	case KindDial:
		return h.DecodeParams(&DialParams{})
	default:
		return fmt.Errorf("%s stream params: %w: no params check for this kind", k, ErrUnknownKind)
	}
	if err := h.DecodeParams(v); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		// As ExecRequest.Validate reports them: the size problems alone
		// when there are any, so that the class of the error is clear.
		if big := sizeErrors(err); len(big) > 0 {
			err = errors.Join(big...)
		}
		return &paramsError{kind: k, err: err}
	}
	return nil
}

// paramsError is a failed Validate of a kind's params, named by kind
// ("exec params: argv[0] is empty; env key ..."). It matches what err
// matches (ErrTooLarge for size problems).
type paramsError struct {
	kind Kind
	err  error
}

func (e *paramsError) Error() string { return e.kind.String() + " params: " + joinLines(e.err) }
func (e *paramsError) Unwrap() error { return e.err }

// StreamParamsAPIError is CheckStreamParams as a NATS API error, nil when
// params are good: 413 too_large when a problem is one of size, else 400
// invalid_request, as ExecRequest.Validate answers.
func StreamParamsAPIError(k Kind, params []byte) *APIError {
	err := CheckStreamParams(k, params)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrTooLarge):
		return NewAPIError(413, ErrCodeTooLarge, "%v", err)
	}
	return NewAPIError(400, ErrCodeInvalid, "%v", err)
}

// timeoutRoom is what a coordinator's default timeout adds to the encoded
// params of an exec that names none: `,"timeout_ms":N` at its longest.
var timeoutRoom = len(`,"timeout_ms":9223372036854775807`)

// HeaderSizeError is the error for params that are n bytes as JSON and do
// not fit a stream header; what names them ("exec params (script, argv,
// env, cwd)"). It matches ErrTooLarge and reads "WHAT are N bytes as JSON,
// over the stream header limit of 65536 bytes (64 KiB)": every refusal of
// params too large for a header gives that one number, MaxHeaderSize.
func HeaderSizeError(what string, n int) error { return headerSizeError(what, n, "") }

func headerSizeError(what string, n int, note string) error {
	return tooLarge("%s are %d bytes as JSON%s, over the stream header limit of %d bytes (%d KiB)", what, n, note, MaxHeaderSize, MaxHeaderSize>>10)
}

// CheckHeaderSize encodes params as a stream header carries them
// (MarshalJSON) and returns a HeaderSizeError when they would not fit
// MaxHeaderSize. *ExecParams without a timeout are measured with the room a
// coordinator's default timeout takes (it adds one on the job path and on
// the stream relay), so that what passes here passes there too.
func CheckHeaderSize(what string, params any) error {
	b, err := MarshalJSON(params)
	if err != nil {
		return fmt.Errorf("%s cannot be encoded as JSON: %v", what, err)
	}
	n := len(b)
	if p, ok := params.(*ExecParams); ok && p.TimeoutMS == 0 {
		if n+timeoutRoom > MaxHeaderSize {
			return headerSizeError(what, n+timeoutRoom, " (counting the coordinator's default timeout)")
		}
		return nil
	}
	if n > MaxHeaderSize {
		return HeaderSizeError(what, n)
	}
	return nil
}

// MaxUserLen bounds the user field of exec, copy and pty params (Linux's
// LOGIN_NAME_MAX is 256 with the NUL).
const MaxUserLen = 255

// checkUser reports a user field that cannot name a local account: a name
// as useradd(8) accepts it in its relaxed form (no NUL, '/', ':',
// whitespace or control characters, not starting with '-' or '+', not "."
// or "..") or a decimal uid, at most MaxUserLen bytes. Empty is valid (the
// agent's own user).
func checkUser(u string) []error {
	if u == "" {
		return nil
	}
	if len(u) > MaxUserLen {
		return []error{fmt.Errorf("user: longer than %d bytes: %w", MaxUserLen, ErrTooLarge)}
	}
	if u == "." || u == ".." || u[0] == '-' || u[0] == '+' || u[0] == '~' {
		return []error{fmt.Errorf("user %s: not a user name or uid", Clip(u))}
	}
	for _, r := range u {
		if r <= ' ' || r == 0x7f || r == '/' || r == ':' || r == ',' || r == '\\' || r == utf8.RuneError {
			return []error{fmt.Errorf("user %s: not a user name or uid", Clip(u))}
		}
	}
	return nil
}
