package cli

import (
	"context"
	"math"
	"net"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// The CLI's parsers of its own arguments: what a command line accepts
// must be what the API accepts, so that a mistake is a usage error (exit
// 2, with the flag's name) and never a request the coordinator refuses or
// a value silently different from the one written.

// FuzzExecFlags sets --timeout, --output-limit, --selector, --env and a
// command after -- as `tether exec` reads them (the flags' Set methods,
// then execOptions.Validate and request): an accepted command line makes a
// request that ExecRequest.Validate accepts, with the timeout and the
// limit as given; a refused value is refused with a short message.
func FuzzExecFlags(f *testing.F) {
	for _, s := range []struct{ timeout, limit, sel, env, arg string }{
		{"30s", "64MiB", "gpu=a100", "A=1", "true"},
		{"1.5", "unlimited", "a in (b,c)", "A=", "echo"},
		{"NaN", "0", "", "=x", ""},
		{"Inf", "-1", ",", "A", "x"},
		{"-Inf", "9223372036854775807", " ", "A=B=C", "x"},
		{"2562047h47m16.854775807s", "8EiB", "a=b,,c=d", "A\x00=1", "x"},
		{"4611686018.427387904", "1 KiB", "!a", "A=1", "x"},
		{"1e-10", "  12K ", "a notin (x)", "A=1", "x"},
		{"0x1p62", "1000000TB", "a", "A=1", "x"},
	} {
		f.Add(s.timeout, s.limit, s.sel, s.env, s.arg)
	}
	f.Fuzz(func(t *testing.T, timeout, limit, sel, env, arg string) {
		if strings.ContainsRune(timeout+limit+sel+env+arg, 0) {
			return // a command line cannot hold NUL
		}
		// The CLI quotes its own arguments whole (%q: up to 4 bytes per
		// byte, at most twice): bounded by them, not by a constant.
		bound := 8*len(timeout+limit+sel+env+arg) + 600
		short := func(flag string, err error) {
			if len(err.Error()) > bound {
				t.Fatalf("%s: a message of %d bytes: %.200q…", flag, len(err.Error()), err.Error())
			}
		}
		var o execOptions
		if err := (durationFlag{d: &o.Timeout, max: maxTimeout}).Set(timeout); err != nil {
			short("--timeout", err)
			return
		}
		if n, err := strconv.ParseFloat(timeout, 64); err == nil && (math.IsNaN(n) || math.IsInf(n, 0)) {
			t.Fatalf("--timeout %q accepted as %v", timeout, o.Timeout)
		}
		if err := (outputLimitFlag{&o.OutputLimit}).Set(limit); err != nil {
			short("--output-limit", err)
			return
		}
		if o.OutputLimit == 0 || o.OutputLimit < 0 && o.OutputLimit != protocol.OutputUnlimited {
			t.Fatalf("--output-limit %q accepted as %d", limit, o.OutputLimit)
		}
		if got := (outputLimitFlag{&o.OutputLimit}).String(); got != "" {
			var again int64
			if err := (outputLimitFlag{&again}).Set(got); err != nil || again != o.OutputLimit {
				t.Fatalf("--output-limit %q → %d → %q → %d, %v", limit, o.OutputLimit, got, again, err)
			}
		}
		o.Selector, o.SelectorGiven = sel, true
		o.Env = []string{env}
		argv := []string{arg}
		if err := o.Validate(argv); err != nil {
			short("exec", err)
			return
		}
		req, err := o.request(context.Background(), argv, strings.NewReader(""))
		if err != nil {
			t.Fatalf("valid options, no request: %v", err)
		}
		if e := req.Validate(); e != nil {
			t.Fatalf("--timeout %q --output-limit %q --selector %q --env %q -- %q: the CLI accepts, the API refuses: %v", timeout, limit, sel, env, arg, e)
		}
		if time.Duration(req.Timeout) != o.Timeout || req.OutputLimit != o.OutputLimit {
			t.Fatalf("request carries timeout %v, limit %d; flags said %v, %d", time.Duration(req.Timeout), req.OutputLimit, o.Timeout, o.OutputLimit)
		}
	})
}

// FuzzOperands parses the operands of `tether cp` (NODE:PATH or a local
// path) and of `tether forward` (NODE TARGET [LOCAL_ADDR]): a remote end
// names a valid node and a clean absolute path; a forward listens on
// loopback only; errors are short.
func FuzzOperands(f *testing.F) {
	for _, s := range []string{"node-1:/srv/app/", "./a:b", "n:/", "n:rel", "-n:/x", "/abs:x", "n:/a/../..//b/", ":x", "C:\\x", "n:/a:b", "a/b:/c"} {
		f.Add(s, "openshell", "8080")
	}
	f.Add("n", "t", "0.0.0.0:80")
	f.Add("n", "t", "[::1]:0")
	f.Add("n", "t", "localhost:65536")
	f.Add("n", "t", "127.0.0.1.nip.io:80")
	f.Fuzz(func(t *testing.T, operand, target, local string) {
		short := func(what string, err error) {
			if len(err.Error()) > 10*len(operand+target+local)+600 { // quoted, twice at most
				t.Fatalf("%s: a message of %d bytes", what, len(err.Error()))
			}
		}
		end, err := parseCopyEnd(operand)
		switch {
		case err != nil:
			short("cp", err)
		case end.node != "":
			if protocol.ValidNodeID(end.node) != nil || !path.IsAbs(end.path) || path.Clean(end.path) != end.path {
				t.Fatalf("cp operand %q parsed as node %q path %q", operand, end.node, end.path)
			}
			if !strings.HasPrefix(operand, end.node+":") {
				t.Fatalf("cp operand %q: node %q is not its prefix", operand, end.node)
			}
		default:
			if end.path != operand {
				t.Fatalf("local cp operand %q parsed as %q", operand, end.path)
			}
		}
		a, err := parseForwardArgs([]string{operand, target, local})
		if err != nil {
			short("forward", err)
			return
		}
		host, port, err := net.SplitHostPort(a.Local)
		if err != nil {
			t.Fatalf("forward %q accepted with local address %q: %v", local, a.Local, err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			t.Fatalf("forward %q listens on %q, not on a loopback address", local, a.Local)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			t.Fatalf("forward %q listens on port %q (%d, %v)", local, port, n, err)
		}
	})
}

// TestOutputLimitStringReadsBack: the flag printed a limit that is not a
// multiple of a KiB as "1000bytes", which it then refused to read.
func TestOutputLimitStringReadsBack(t *testing.T) {
	for _, n := range []int64{1, 1000, 1 << 20, 3 << 30, protocol.OutputUnlimited} {
		v := n
		s := (outputLimitFlag{&v}).String()
		var again int64
		if err := (outputLimitFlag{&again}).Set(s); err != nil || again != n {
			t.Errorf("%d prints as %q, which reads as %d, %v", n, s, again, err)
		}
	}
}
