package opensandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"time"

	"github.com/tetherfleet/tether/coordinator/ledger"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// modifyResponse does the facade's bookkeeping on a node's answer before
// the reverse proxy copies it to the caller: WebSocket accounting,
// Location and endpoint rewriting, and ledger writes. It never fails the
// request: what it cannot do it logs.
func (f *Facade) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	if resp.StatusCode == http.StatusSwitchingProtocols {
		st.upgraded = true
		f.m.wsActive.Inc()
		f.m.wsTotal.Inc()
		return nil
	}
	resp.Body = &cutDetector{ReadCloser: resp.Body, st: st}
	f.rewriteLocation(resp, st)
	method := resp.Request.Method
	switch st.route.Kind {
	case osb.RouteSandboxes:
		if method == http.MethodPost && resp.StatusCode == http.StatusAccepted {
			f.recordCreate(resp, st)
		}
	case osb.RouteSandbox:
		switch {
		case method == http.MethodDelete && (resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotFound):
			f.recordDeleted(resp, st)
		case method == http.MethodGet && resp.StatusCode == http.StatusOK:
			f.refresh(resp, st)
		case resp.StatusCode == http.StatusNotFound:
			f.found.forget(st.route.ID)
		}
	case osb.RouteMetadata:
		if resp.StatusCode == http.StatusOK {
			f.refresh(resp, st)
		}
	case osb.RouteRenewExpiration:
		if resp.StatusCode == http.StatusOK {
			f.recordRenew(resp, st)
		}
	case osb.RouteEndpoint:
		if resp.StatusCode == http.StatusOK {
			f.rewriteEndpoint(resp, st)
		}
	}
	return nil
}

// rewriteLocation points an absolute Location header at the facade (the
// node's own address is unreachable for callers; wire-facts §8.1).
// Relative ones already resolve against the facade.
func (f *Facade) rewriteLocation(resp *http.Response, st *reqState) {
	loc := resp.Header.Get("Location")
	if loc == "" {
		return
	}
	u, err := url.Parse(loc)
	if err != nil || u.Host == "" || st.host == "" {
		return
	}
	u.Host = st.host
	if u.Scheme == "http" || u.Scheme == "https" {
		u.Scheme = st.scheme
	}
	resp.Header.Set("Location", u.String())
}

// rewriteEndpoint replaces the endpoint of GET .../endpoints/{port}, with
// or without use_server_proxy, by the facade's own proxy route
// "<facade host>/sandboxes/<id>/proxy/<port>" (no scheme, no /v1, as the
// server writes it; OSB-6, wire-facts §8.1). Every other field, the
// headers map included, is kept verbatim.
func (f *Facade) rewriteEndpoint(resp *http.Response, st *reqState) {
	b, ok := readLimited(resp, maxDecodeBody)
	if !ok {
		f.log.Warn("endpoint response not rewritten: unreadable", "node", st.node, "id", st.route.ID)
		return
	}
	out, err := rewriteEndpointBody(b, osb.ProxyEndpoint(st.host, st.route.ID, st.route.Port))
	if err != nil {
		f.log.Warn("endpoint response not rewritten", "node", st.node, "id", st.route.ID, "err", err)
		return
	}
	replaceBody(resp, out)
}

// rewriteEndpointBody returns the JSON object b with its "endpoint" field
// set to endpoint and every other field's value as b has it (compacted,
// not re-escaped: json.Marshal would turn '<', '>' and '&' in a header
// value or in the endpoint itself into \u003c escapes). It fails if b is
// not a JSON object.
func rewriteEndpointBody(b []byte, endpoint string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if fields == nil {
		return nil, errors.New("not a JSON object: null")
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(endpoint); err != nil {
		return nil, err
	}
	fields["endpoint"] = bytes.TrimSpace(out.Bytes())
	out.Reset()
	if err := enc.Encode(fields); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(out.Bytes()), nil
}

// recordDeleted records a delete the node confirmed: 204, or 404 (the
// sandbox was already gone).
func (f *Facade) recordDeleted(resp *http.Response, st *reqState) {
	f.found.forget(st.rec.ID)
	if !st.fromLedger {
		return
	}
	ctx, cancel := ledgerCtx(resp.Request.Context())
	defer cancel()
	if err := f.cfg.Ledger.Deleted(ctx, st.rec.Key()); err != nil {
		f.ledgerFailed(resp, st, st.rec.ID, fmt.Errorf("record delete: %w", err))
		return
	}
	f.log.Info("sandbox deleted", "node", st.node, "id", st.rec.ID, "status", resp.StatusCode)
}

// recordRenew records the new expiry of a 200 renew-expiration answer
// (wire-facts §8.4).
func (f *Facade) recordRenew(resp *http.Response, st *reqState) {
	b, ok := readLimited(resp, maxDecodeBody)
	if !ok {
		f.ledgerFailed(resp, st, st.rec.ID, fmt.Errorf("renew response from node %s not readable", st.node))
		return
	}
	var rr osb.RenewExpirationResponse
	if err := json.Unmarshal(b, &rr); err != nil || rr.ExpiresAt.IsZero() {
		f.ledgerFailed(resp, st, st.rec.ID, fmt.Errorf("decode renew response from node %s: %v", st.node, err))
		return
	}
	f.setExpiry(resp, st, rr.ExpiresAt)
}

// refresh records what changed in a 200 Sandbox body (GET
// /sandboxes/{id}, PATCH .../metadata) of a sandbox the ledger holds: a
// new expiry, and new metadata of a live managed record (so its
// attribution follows). Unchanged records are not written.
func (f *Facade) refresh(resp *http.Response, st *reqState) {
	if !st.fromLedger {
		return
	}
	b, ok := readLimited(resp, maxDecodeBody)
	if !ok {
		return
	}
	var sb osb.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil || sb.ID != st.rec.ID {
		return
	}
	if !sb.ExpiresAt.IsZero() && !sb.ExpiresAt.Equal(st.rec.ExpiresAt) {
		f.setExpiry(resp, st, sb.ExpiresAt)
	}
	if st.route.Kind == osb.RouteMetadata && st.rec.Managed && st.rec.State == ledger.StateLive && !maps.Equal(sb.Metadata, st.rec.Labels) {
		rec := st.rec
		rec.Labels = sb.Metadata
		if rec.Labels == nil {
			rec.Labels = map[string]string{}
		}
		rec.LastSeen = f.now()
		ctx, cancel := ledgerCtx(resp.Request.Context())
		defer cancel()
		if err := f.cfg.Ledger.Created(ctx, rec); err != nil {
			f.ledgerFailed(resp, st, rec.ID, fmt.Errorf("record metadata: %w", err))
		}
	}
}

// setExpiry writes a new expiry of st's sandbox to the ledger.
func (f *Facade) setExpiry(resp *http.Response, st *reqState, at time.Time) {
	ctx, cancel := ledgerCtx(resp.Request.Context())
	defer cancel()
	if err := f.cfg.Ledger.SetExpiry(ctx, st.rec.Key(), at); err != nil {
		f.ledgerFailed(resp, st, st.rec.ID, fmt.Errorf("record expiry: %w", err))
		return
	}
	st.rec.ExpiresAt = at
}
