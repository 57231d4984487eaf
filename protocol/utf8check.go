package protocol

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
)

// Strings a process is made of (script, arguments, commands, environment,
// working directory, terminal name) travel as JSON strings, and JSON
// carries only UTF-8: encoding/json turns each byte that is not UTF-8
// into U+FFFD, so the node would run another command than the one asked
// for, silently. The params types' Validate refuse such strings (CheckUTF8),
// and so, before anything is sent, does package client (ExecRequest.Validate
// goes through ExecParams.Validate; OpenStream checks the exec and pty
// params it is given). On the agent's side a header never holds one: the
// strict decoder refuses bytes that are not UTF-8.

// InvalidUTF8At returns the position, counting from 1 as cmp(1) does, of
// the first byte of s that is not valid UTF-8, or 0 when s is valid UTF-8.
func InvalidUTF8At(s string) int {
	if utf8.ValidString(s) {
		return 0
	}
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i + 1
		}
		i += size
	}
	return 0
}

// CheckUTF8 reports, joined, each string of p that is not valid UTF-8
// (InvalidUTF8At): script, argv[i], commands[i], an env key or value,
// cwd, each error naming the field and the byte ("argv[1]: not valid
// UTF-8 at byte 3"). Validate includes it.
func (p *ExecParams) CheckUTF8() error {
	var errs []error
	errs = append(errs, checkUTF8("script", p.Script)...)
	errs = append(errs, checkArgsUTF8("argv", p.Argv)...)
	errs = append(errs, checkArgsUTF8("commands", p.Commands)...)
	errs = append(errs, checkEnvUTF8(p.Env)...)
	errs = append(errs, checkUTF8("cwd", p.Cwd)...)
	return errors.Join(errs...)
}

// CheckUTF8 reports, joined, each string of p that is not valid UTF-8
// (InvalidUTF8At): argv[i], an env key or value, cwd, term, each error
// naming the field and the byte. Validate includes it.
func (p *PTYParams) CheckUTF8() error {
	var errs []error
	errs = append(errs, checkArgsUTF8("argv", p.Argv)...)
	errs = append(errs, checkEnvUTF8(p.Env)...)
	errs = append(errs, checkUTF8("cwd", p.Cwd)...)
	errs = append(errs, checkUTF8("term", p.Term)...)
	return errors.Join(errs...)
}

func checkUTF8(name, v string) []error {
	if n := InvalidUTF8At(v); n > 0 {
		return []error{fmt.Errorf("%s: not valid UTF-8 at byte %d", name, n)}
	}
	return nil
}

// checkArgsUTF8 names the first entry of args that is not valid UTF-8,
// so that a long list cannot blow up the message.
func checkArgsUTF8(name string, args []string) []error {
	for i, a := range args {
		if n := InvalidUTF8At(a); n > 0 {
			return []error{fmt.Errorf("%s[%d]: not valid UTF-8 at byte %d", name, i, n)}
		}
	}
	return nil
}

// checkEnvUTF8 names the first variable, in key order, whose key or
// value is not valid UTF-8.
func checkEnvUTF8(env map[string]string) []error {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if n := InvalidUTF8At(k); n > 0 {
			return []error{fmt.Errorf("env key %s: not valid UTF-8 at byte %d", QuoteName(k), n)}
		}
		if n := InvalidUTF8At(env[k]); n > 0 {
			return []error{fmt.Errorf("env %s: value not valid UTF-8 at byte %d", QuoteName(k), n)}
		}
	}
	return nil
}
