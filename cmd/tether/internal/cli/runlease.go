package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// Environment variables run-lease reads and sets. NEMO_GYM_RUN_ID is the
// run id NeMo Gym's attribution labels sandboxes with (wire-facts §4.2).
const (
	runIDEnv      = "NEMO_GYM_RUN_ID"
	tetherRunEnv  = "TETHER_RUN"
	defaultLeaseT = 30 * time.Second
)

// runLeaseOptions are the flags of `tether run-lease`.
type runLeaseOptions struct {
	// Run is the run id; default $TETHER_RUN, else $NEMO_GYM_RUN_ID, else a
	// random 12-hex id.
	Run string
	// TTL is the lease's TTL; renewals go every TTL/3.
	TTL time.Duration
	// Keep leaves the run's lease open when the command exits (it then
	// expires after TTL), instead of closing it and reaping at once.
	Keep bool
	NATS natsOptions
}

func (o *runLeaseOptions) Validate() error {
	var errs []error
	if o.Run != "" {
		if err := protocol.ValidRunID(o.Run); err != nil {
			errs = append(errs, fmt.Errorf("--run: %w", err))
		}
	}
	if o.TTL < protocol.MinLeaseTTL || o.TTL > protocol.MaxLeaseTTL {
		errs = append(errs, fmt.Errorf("--ttl %s is out of range: want %s", humanDuration(o.TTL), durationRange(protocol.MinLeaseTTL, protocol.MaxLeaseTTL)))
	}
	if len(errs) == 0 && o.Run != "" {
		// Anything else the API would refuse of the lease request.
		req := protocol.LeaseOpenRequest{Run: o.Run, TTLMS: o.TTL.Milliseconds()}
		if e := req.Validate(); e != nil {
			return errors.New(e.Message)
		}
	}
	return errors.Join(errs...)
}

func newRunLeaseCmd(e *env) *cobra.Command {
	o := runLeaseOptions{TTL: defaultLeaseT}
	cmd := &cobra.Command{
		Use:   "run-lease [--run R] [--ttl D] -- COMMAND [ARG...]",
		Short: "Run a command that owns a run's sandboxes for exactly as long as it lives",
		Long: `run-lease opens the lease of a run, runs COMMAND with NEMO_GYM_RUN_ID and
TETHER_RUN set to the run id, and renews the lease every TTL/3 while COMMAND
runs. Sandboxes labelled with the run (NeMo Gym's nemo-gym.nvidia.com/run
attribution, or created through a facade with the Tether-Run header) are
owned by the lease: when COMMAND exits the lease is closed and they are
reaped at once; if run-lease itself dies (kill -9, node loss), the lease
expires after TTL and they are reaped then. Exits with COMMAND's exit code
(128+N when signal N killed it), 126 or 127 when COMMAND cannot be executed
or is not found (as a shell reports), and 255 when Tether failed (no
coordinator, the lease could not be opened).`,
		Args: cobra.MinimumNArgs(1),
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			if cmd.ArgsLenAtDash() != 0 {
				return usage(errors.New("put the command after --, as in: tether run-lease -- python train.py"))
			}
			if cmd.Flags().Changed("run") && o.Run == "" {
				return usage(errors.New("--run is empty; leave it out to use $TETHER_RUN, $NEMO_GYM_RUN_ID or a random id"))
			}
			if o.Run == "" {
				o.Run = firstNonEmpty(e.getenv(tetherRunEnv), e.getenv(runIDEnv))
			}
			if o.Run == "" {
				o.Run = newRunID()
			} else if err := protocol.ValidRunID(o.Run); err != nil {
				return usage(fmt.Errorf("run id from the environment: %w", err))
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			return runLease(cmd.Context(), e, c, o, args)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Run, "run", "", "run id (default: $TETHER_RUN, else $NEMO_GYM_RUN_ID, else a random id)")
	boundedDurationVar(f, &o.TTL, "ttl", o.TTL, protocol.MinLeaseTTL, protocol.MaxLeaseTTL, "lease TTL, "+durationRange(protocol.MinLeaseTTL, protocol.MaxLeaseTTL)+": the run's sandboxes are reaped this long after run-lease dies")
	f.BoolVar(&o.Keep, "keep", false, "leave the lease to expire after TTL when COMMAND exits, instead of reaping at once")
	o.NATS.addFlags(cmd)
	return cmd
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// newRunID returns 12 random hex digits, like NeMo Gym's per-process run id.
func newRunID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// runLease holds the lease around the command's life.
func runLease(ctx context.Context, e *env, c *client.Client, o runLeaseOptions, args []string) error {
	host, _ := os.Hostname()
	holder := fmt.Sprintf("%s:%d %s", host, os.Getpid(), args[0])
	if _, err := c.OpenLease(ctx, o.Run, o.TTL, clipHolder(holder)); err != nil {
		if errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeLeaseClosed}) {
			return fmt.Errorf("run-lease: run %s was closed earlier (its sandboxes were reaped) and cannot be reopened; give a new --run id", o.Run)
		}
		return fmt.Errorf("run-lease: %w", err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	cmd.Env = append(os.Environ(), runIDEnv+"="+o.Run, tetherRunEnv+"="+o.Run)
	// The command must not outlive its lease holder.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		closeLease(e, c, o)
		// 127 and 126, as shells report a command not found or not
		// executable.
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		return &exitError{code: code, err: fmt.Errorf("run-lease: %w", err)}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Renewals go on until the command has exited, also while it shuts
	// down after a signal: its sandboxes are its own until then.
	rctx, stopRenew := context.WithCancel(context.WithoutCancel(ctx))
	renewed := make(chan struct{})
	go func() { defer close(renewed); renewLease(rctx, e, c, o) }()

	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		// SIGTERM is passed on. SIGINT from a terminal already reached
		// the command (same foreground process group): sending it again
		// could cut its cleanup short, so it is passed on only when
		// run-lease is not on a terminal (kill -INT, a supervisor).
		if interruptCode(ctx) == exitTerminated {
			cmd.Process.Signal(syscall.SIGTERM)
		} else if !term.IsTerminal(int(os.Stdin.Fd())) {
			cmd.Process.Signal(syscall.SIGINT)
		}
		werr = <-done
	}
	stopRenew()
	<-renewed
	if !o.Keep {
		closeLease(e, c, o)
	}
	var ee *exec.ExitError
	switch {
	case werr == nil:
		return nil
	case errors.As(werr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &exitError{code: 128 + int(ws.Signal())}
		}
		return &exitError{code: ee.ExitCode()}
	}
	return fmt.Errorf("run-lease: %w", werr)
}

// renewLease renews the run's lease every TTL/3 until ctx ends. It warns
// once when a renewal fails (and once when it works again), and once when
// the lease is gone for good.
func renewLease(ctx context.Context, e *env, c *client.Client, o runLeaseOptions) {
	t := time.NewTicker(o.TTL / 3)
	defer t.Stop()
	failing, gone := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, o.TTL/3)
		_, err := c.RenewLease(rctx, o.Run)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if failing {
				fmt.Fprintf(e.stderr, "tether run-lease: lease of run %s renewed again\n", o.Run)
				failing = false
			}
		case errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeLeaseClosed}), errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeNotFound}):
			if !gone { // it cannot come back: say so once
				fmt.Fprintf(e.stderr, "tether run-lease: the lease of run %s is gone (%v): its sandboxes are being reaped\n", o.Run, err)
				gone = true
			}
		default:
			if !failing {
				fmt.Fprintf(e.stderr, "tether run-lease: renew lease of run %s: %v (retrying every %v; it expires %v after the last renewal)\n", o.Run, err, o.TTL/3, o.TTL)
				failing = true
			}
		}
	}
}

// closeLease ends the run: its sandboxes are reaped now.
func closeLease(e *env, c *client.Client, o runLeaseOptions) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.CloseLease(ctx, o.Run); err != nil {
		fmt.Fprintf(e.stderr, "tether run-lease: close lease of run %s: %v (it expires %v after the last renewal)\n", o.Run, err, o.TTL)
	}
}

// clipHolder cuts s to protocol.MaxHolderLen bytes at a character
// boundary, with invalid UTF-8 replaced first (JSON would grow it).
func clipHolder(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= protocol.MaxHolderLen {
		return s
	}
	i := protocol.MaxHolderLen
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
