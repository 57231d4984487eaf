package console

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Auditing: every page a caller asks for, and every login, is one audit
// event (Facade "console", Method "GET PAGE"), as every NATS request is:
// who, which read (the policy operation the page needs, or "console" for
// the front page), the job and nodes it was about, and how it ended. The
// output endpoint's polls past offset 0 continue a read already recorded
// (its first poll, or the job's page) and are not recorded again, as
// `tether audit -f`'s polls are not. Source is the TCP peer
// (http.Request.RemoteAddr), never X-Forwarded-For or another header a
// browser or proxy writes.

// Facade is the AuditEvent.Facade of the console's events.
const Facade = "console"

// Auditor records audit events; *audit.Recorder has it.
type Auditor interface {
	// Record queues ev; it must not block.
	Record(ev *protocol.AuditEvent)
}

// note is what a page learnt for its audit event.
type note struct {
	reason string // a refusal's reason (policy.Reason names, or "unauthenticated")
	detail string // the event's Error: what a refusal was about (never a secret)
	job    string
	nodes  []string
	skip   bool // a continuation of a recorded read
}

// refused notes err's policy reason (no_identity, no_rule, rate_limit...).
func (n *note) refused(err error) {
	var rf *policy.Refusal
	if errors.As(err, &rf) {
		n.reason = rf.Reason.String()
	} else {
		n.reason = "refused"
	}
}

// statusWriter remembers the status of its answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// record sends the audit event of a console request that asked op (its
// name) on page, answered with status after it began at start.
func (h *Handler) record(r *http.Request, op, page string, c caller, n *note, status int, start time.Time) {
	if h.cfg.Auditor == nil || n.skip {
		return
	}
	ev := &protocol.AuditEvent{
		Operation:  op,
		Facade:     Facade,
		Method:     r.Method + " " + page,
		JobID:      n.job,
		Source:     r.RemoteAddr, // net/http's: the TCP peer, never a header
		DurationMS: float64(h.cfg.now().Sub(start).Microseconds()) / 1000,
	}
	if c.Identified {
		ev.Identity, ev.IdentityKey, ev.Account = c.ID.String(), c.ID.Key, c.ID.Account
	}
	nodes := slices.Clone(n.nodes)
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	if len(nodes) > protocol.MaxAuditNodes {
		ev.NodesTotal = len(nodes)
		nodes = nodes[:protocol.MaxAuditNodes]
	}
	ev.Nodes = nodes
	switch {
	case n.reason != "":
		ev.Result, ev.Reason = protocol.AuditRefused, n.reason
	case status < 400:
		ev.Result = protocol.AuditOK
	default:
		ev.Result = protocol.AuditError
	}
	if status >= 400 {
		ev.Status = status
	}
	if d := n.detail; d != "" {
		if len(d) > protocol.MaxAuditErrorLen {
			d = d[:protocol.MaxAuditErrorLen]
		}
		ev.Error = d
	}
	h.cfg.Auditor.Record(ev)
}

// clearTextDetail describes, for the audit, a credential refused because it
// came over plain HTTP from another host: which credential (the token's
// name when it is a console token, never the token) and the peer address,
// so the operator knows which token to replace and which host sent it.
// how is "bearer", "login" (a token given to the login exchange) or
// "cookie" (tok is then the cookie's value).
func (h *Handler) clearTextDetail(r *http.Request, tok, how string) string {
	var what string
	switch {
	case how != "cookie":
		what = "a " + how + " token that is not a console token"
		if h.cfg.Tokens != nil {
			if name, ok := h.cfg.Tokens(tok); ok {
				what = "the console token " + policy.Identity{Kind: policy.KindToken, Name: name}.String() + " (" + how + ")"
			}
		}
	default:
		what = "a session cookie that is not valid here"
		if name, ok := h.openSession(tok); ok {
			what = "a session cookie of " + policy.Identity{Kind: policy.KindToken, Name: name}.String()
		}
	}
	return what + " arrived from " + r.RemoteAddr + " over plain HTTP (neither TLS nor loopback): replace that token if others could see that network"
}
