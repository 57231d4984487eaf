package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/protocol"
)

// defaultForwardAddr is where `tether forward` listens when no LOCAL_ADDR
// is given: loopback, a port the kernel picks.
const defaultForwardAddr = "127.0.0.1:0"

// forwardOptions are the flags of `tether forward`.
type forwardOptions struct {
	// NATS says how to reach the API.
	NATS natsOptions
	// Stdio joins stdin and stdout to one connection to the target
	// instead of listening (a ProxyCommand).
	Stdio bool
}

// forwardArgs are the positional arguments of `tether forward`.
type forwardArgs struct {
	Node, Target, Local string
}

// parseForwardArgs checks NODE TARGET [LOCAL_ADDR]. LOCAL_ADDR may be a
// port alone ("8080" or ":8080"), which binds 127.0.0.1. Only loopback
// addresses are accepted: the gateways behind a forward trust loopback
// callers, so a forward must not make them reachable from the network.
func parseForwardArgs(args []string) (forwardArgs, error) {
	a := forwardArgs{Node: args[0], Target: args[1], Local: defaultForwardAddr}
	var errs []error
	if err := checkNodeArg(a.Node); err != nil {
		errs = append(errs, err)
	}
	if err := protocol.ValidTargetName(a.Target); err != nil {
		errs = append(errs, fmt.Errorf("TARGET %s: %s (a target the node serves, as openshell or opensandbox; tether nodes --json lists them)", protocol.Clip(a.Target), argProblem(err, a.Target)))
	}
	if len(args) == 3 {
		local := args[2]
		if !strings.Contains(local, ":") {
			local = ":" + local
		}
		host, port, err := net.SplitHostPort(local)
		_, perr := strconv.ParseUint(port, 10, 16)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("local address %q: want [HOST:]PORT", args[2]))
		case perr != nil:
			errs = append(errs, fmt.Errorf("local address %q: port %q is not a number from 0 to 65535", args[2], port))
		case host == "" || host == "localhost":
			a.Local = net.JoinHostPort("127.0.0.1", port)
		default:
			ip := net.ParseIP(host)
			if ip == nil || !ip.IsLoopback() {
				errs = append(errs, fmt.Errorf("local address %q: forwards listen on loopback only (127.0.0.1, ::1): the target behind it trusts local callers", args[2]))
			}
			a.Local = local
		}
	}
	return a, errors.Join(errs...)
}

// argProblem is what a protocol validation error of value says is wrong
// with it, without its lead ("target name X: ", X the value as
// protocol.Clip quotes it, which may itself hold ": "), which the caller
// replaces with the argument's name and the value as typed.
func argProblem(err error, value string) string {
	msg := err.Error()
	if i := strings.Index(msg, protocol.Clip(value)+": "); i >= 0 {
		return msg[i+len(protocol.Clip(value))+2:]
	}
	if _, rest, ok := strings.Cut(msg, ": "); ok {
		return rest
	}
	return msg
}

// checkNodeArg checks the NODE argument of a command (forward, shell,
// ssh-proxy): nil, or what is wrong with it as typed.
func checkNodeArg(node string) error {
	if node == "" {
		return errors.New("NODE is empty: give a node id (tether nodes lists them)")
	}
	if err := protocol.ValidNodeID(node); err != nil {
		return fmt.Errorf("NODE %s: %s (a node id, as tether nodes lists them)", protocol.Clip(node), argProblem(err, node))
	}
	return nil
}

func newForwardCmd(e *env) *cobra.Command {
	var o forwardOptions
	cmd := &cobra.Command{
		Use:   "forward NODE TARGET [LOCAL_ADDR]",
		Short: "Forward a local port to a target on a node (like kubectl port-forward)",
		Long: `Forward listens on LOCAL_ADDR (default 127.0.0.1 on a free port) and carries
every connection to TARGET on NODE through the node's tunnel. TARGET is one of
the targets the node's agent is configured for (see "tether nodes --json":
targets), e.g. openshell or opensandbox. It runs until interrupted (exit code
130, 143 on SIGTERM); it exits 255 when Tether failed (no coordinator, the
node is not connected or does not serve TARGET) and 2 for a usage error.

With --stdio it listens nowhere: stdin and stdout are joined to one
connection to TARGET (for a ProxyCommand, or a pipe), and it exits 0 when
the connection ended.

Examples:
  tether forward gpu-07 openshell 8080     # grpcurl -plaintext 127.0.0.1:8080 ...
  tether forward gpu-07 opensandbox
  tether forward --stdio gpu-07 web < request > response`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usage(fmt.Errorf("want NODE TARGET [LOCAL_ADDR], got %d %s", len(args), plural(len(args), "argument", "arguments")))
			}
			return nil
		},
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			a, err := parseForwardArgs(args)
			if err == nil && o.Stdio && len(args) == 3 {
				err = errors.New("--stdio takes no LOCAL_ADDR: it joins stdin and stdout to the target")
			}
			if err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			if o.Stdio {
				s, err := c.Dial(cmd.Context(), a.Node, a.Target)
				if err != nil {
					return err
				}
				return joinStdio(cmd.Context(), e, s)
			}
			return runForward(cmd.Context(), e, c, a)
		}),
	}
	cmd.Flags().BoolVar(&o.Stdio, "stdio", false, "join stdin and stdout to one connection to TARGET instead of listening")
	o.NATS.addFlags(cmd)
	return cmd
}

// runForward checks that the node serves the target, listens, and serves
// connections until ctx ends.
func runForward(ctx context.Context, e *env, c *client.Client, a forwardArgs) error {
	nodes, err := c.Nodes(ctx, "")
	if err != nil {
		return err
	}
	i := slices.IndexFunc(nodes, func(n protocol.NodeInfo) bool { return n.ID == a.Node })
	if i < 0 {
		return fmt.Errorf("node %q is not connected (%s; tether nodes lists those that are)", a.Node, protocol.ErrCodeUnknownNode)
	}
	if ts := nodes[i].Targets; !slices.Contains(ts, a.Target) {
		serves := "no targets"
		if len(ts) > 0 {
			serves = strings.Join(ts, ", ")
		}
		return fmt.Errorf("node %s has no target %q (it serves: %s)", a.Node, a.Target, serves)
	}
	ln, err := net.Listen("tcp", a.Local)
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	fmt.Fprintf(e.stdout, "Forwarding from %s -> %s/%s\n", ln.Addr(), a.Node, a.Target)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	var wg sync.WaitGroup
	// Deferred calls run last first: the listener closes before the wait
	// for the connections in flight.
	defer wg.Wait()
	defer ln.Close()
	backoff := 5 * time.Millisecond
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return &exitError{code: interruptCode(ctx)}
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of file descriptors, say: wait and accept again.
				fmt.Fprintf(e.stderr, "tether forward: accept on %s: %v; retrying in %v\n", ln.Addr(), err, backoff)
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			return fmt.Errorf("forward: accept on %s: %w", ln.Addr(), err)
		}
		backoff = 5 * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := forwardConn(ctx, c, a, conn); err != nil {
				fmt.Fprintf(e.stderr, "tether forward: connection from %s: %v\n", conn.RemoteAddr(), err)
			}
		}()
	}
}

// forwardConn carries one local connection to the target and back. Each
// direction's end is passed on as a half-close; the connection ends when
// both directions did, or when ctx ends.
func forwardConn(ctx context.Context, c *client.Client, a forwardArgs, conn net.Conn) error {
	defer conn.Close()
	s, err := c.Dial(ctx, a.Node, a.Target)
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close(); s.Close() })
	defer stop()
	errc := make(chan error, 2)
	// CopyPooled, not io.Copy's 32 KiB: under bulk its 256 KiB writes
	// make 256 KiB tunnel frames (a quarter of the frames and system
	// calls per byte on every hop), and an idle connection holds 32 KiB.
	go func() {
		_, err := countcopy.CopyPooled(s, conn, nil)
		if err == nil {
			err = s.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := countcopy.CopyPooled(conn, s, nil)
		if tc, ok := conn.(*net.TCPConn); ok && err == nil {
			err = tc.CloseWrite()
		}
		errc <- err
	}()
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			conn.Close()
			s.Close()
		}
	}
	if ctx.Err() != nil || errors.Is(first, net.ErrClosed) {
		return nil
	}
	return first
}
