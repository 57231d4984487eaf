package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// legacyDecodeStrict is the strict decoder before the strict walker
// (b42d220): encoding/json alone, with DisallowUnknownFields. It is the
// baseline of BenchmarkStrictDecode, measured in the same run.
func legacyDecodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after JSON value")
	}
	return nil
}

// benchScript is a shell script of n bytes with the quotes, backslashes,
// tabs and newlines real scripts have (all escaped in JSON) and some
// non-ASCII text.
func benchScript(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "if [ -f \"/data/shard-%d\" ]; then\n\tpython3 -c 'import sys; print(sys.argv[1])' \"état %d\" | sed 's/\\\\/\\//g'\nfi\n", i, i)
	}
	return b.String()[:n]
}

// BenchmarkStrictDecode measures a typical exec request, a request with a
// 48 KiB script, and the same two as stream header params (the path every
// tunnel stream's header takes), plus a report frame through DecodeJSON,
// each with the strict decoder and with the legacy one. Run rounds
// interleaved (see the report for the commands) and compare the ratios.
func BenchmarkStrictDecode(b *testing.B) {
	typical := protocol.ExecRequest{
		ID:          "train-42",
		Target:      protocol.Target{Selector: "gpu=a100,zone!=b"},
		Argv:        []string{"python3", "train.py", "--epochs", "3", "--lr", "0.001"},
		Env:         map[string]string{"CUDA_VISIBLE_DEVICES": "0,1", "RUN": "r-7", "HF_HOME": "/data/hf"},
		Cwd:         "/work/run-7",
		Timeout:     protocol.Duration(3600e9),
		OutputLimit: 1 << 20,
	}
	big := protocol.ExecRequest{Target: protocol.Target{Node: "gpu-1"}, Script: benchScript(protocol.MaxScriptSize), Env: typical.Env}
	typicalParams := typical.Params(0)
	typicalParams.JobID = "train-42"
	bigParams := big.Params(0)
	exit := protocol.ExitStatus{ExitCode: 1, Signal: "KILL", DurationMS: 1234.5, StdoutBytes: 1 << 20, StderrBytes: 77, StdoutTruncated: true}

	mustMarshal := func(v any) []byte {
		out, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	cases := []struct {
		name   string
		data   []byte
		legacy func([]byte) error
		strict func([]byte) error
	}{
		{"exec-request", mustMarshal(typical),
			func(d []byte) error { var r protocol.ExecRequest; return legacyDecodeStrict(d, &r) },
			func(d []byte) error {
				var r protocol.ExecRequest
				if e := protocol.DecodeRequest(d, &r); e != nil {
					return e
				}
				return nil
			}},
		{"script-48k-request", mustMarshal(big),
			func(d []byte) error { var r protocol.ExecRequest; return legacyDecodeStrict(d, &r) },
			func(d []byte) error {
				var r protocol.ExecRequest
				if e := protocol.DecodeRequest(d, &r); e != nil {
					return e
				}
				return nil
			}},
		{"exec-header", mustMarshal(typicalParams),
			func(d []byte) error { var p protocol.ExecParams; return legacyDecodeStrict(d, &p) },
			func(d []byte) error {
				var p protocol.ExecParams
				return protocol.Header{Kind: protocol.KindExec, Params: d}.DecodeParams(&p)
			}},
		{"script-48k-header", mustMarshal(bigParams),
			func(d []byte) error { var p protocol.ExecParams; return legacyDecodeStrict(d, &p) },
			func(d []byte) error {
				var p protocol.ExecParams
				return protocol.Header{Kind: protocol.KindExec, Params: d}.DecodeParams(&p)
			}},
		{"exit-frame", mustMarshal(exit),
			func(d []byte) error { var s protocol.ExitStatus; return json.Unmarshal(d, &s) },
			func(d []byte) error { var s protocol.ExitStatus; return protocol.DecodeJSON(d, &s) }},
	}
	for _, c := range cases {
		if err := c.strict(c.data); err != nil {
			b.Fatalf("%s: strict: %v", c.name, err)
		}
		if err := c.legacy(c.data); err != nil {
			b.Fatalf("%s: legacy: %v", c.name, err)
		}
		for _, impl := range []struct {
			name string
			f    func([]byte) error
		}{{"legacy", c.legacy}, {"strict", c.strict}} {
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(c.data)))
				b.ReportAllocs()
				cpu0 := processCPU()
				for b.Loop() {
					if err := impl.f(c.data); err != nil {
						b.Fatal(err)
					}
				}
				// CPU time, not wall time: on a loaded machine the wall
				// clock mostly measures waiting for a core.
				b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// processCPU returns the CPU time the process used so far (user and
// system, all threads, so the garbage collector's share counts), in
// nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
