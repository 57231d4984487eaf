package opensandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// list answers GET /sandboxes with the merged list of every node with the
// target. The caller's page and pageSize are validated as the server does
// (FastAPI's 422 body, OSB-4); its state and metadata parameters go to the
// nodes verbatim, so a malformed filter gets the node's own 400 (OSB-3).
// Each node is read whole (pages of osb.MaxPageSize); the merged items are
// sorted by (createdAt, id, node) and cut to the caller's page.
func (f *Facade) list(w http.ResponseWriter, r *http.Request, st *reqState) {
	page, pageSize, issues := pagingParams(r.URL.Query())
	if len(issues) > 0 {
		writeJSON(w, http.StatusUnprocessableEntity, osb.ValidationErrorBody{Detail: issues})
		return
	}
	v := f.view()
	if missing := f.missingNodes(v); len(missing) > 0 {
		writeError(w, http.StatusServiceUnavailable, CodeNodeUnavailable,
			fmt.Sprintf("cannot list every sandbox: %s; the list would be incomplete", strings.Join(missing, "; ")))
		return
	}
	if err := f.decide(st, policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: st.who.String()}); err != nil {
		writeRefusal(w, err)
		return
	}
	v.targets = f.reachable(st, v.targets)
	for _, n := range v.targets {
		st.note.node(n.ID)
	}
	keep := f.listFilter(st)
	filters := filterQuery(r.URL.RawQuery)

	res := make([]nodeList, len(v.targets))
	f.fanOut(len(v.targets), func(i int) { res[i] = f.listOn(r.Context(), r, v.targets[i], filters) },
		func(i int, err error) { res[i] = nodeList{node: v.targets[i].ID, info: v.targets[i], err: err} })

	var items []listItem
	var failed []string
	for _, nl := range res {
		if nl.passStatus != 0 {
			// The caller's own mistake (a bad filter, a missing API key):
			// every node would say the same, so the first answer stands.
			for _, k := range []string{"Content-Type", osb.HeaderRequestID, "Www-Authenticate"} {
				if vals := nl.passHeader.Values(k); len(vals) > 0 {
					w.Header()[k] = vals
				}
			}
			writeBody(w, nl.passStatus, nl.passHeader.Get("Content-Type"), nl.passBody)
			return
		}
		if nl.err != nil {
			if f.skippable(nl.info, nl.err) {
				f.log.Debug("list: leaving out a node whose lifecycle server cannot be reached and that holds no live sandboxes", "node", nl.node, "err", nl.err)
				continue
			}
			failed = append(failed, fmt.Sprintf("node %s, target %s: %v", nl.node, Target, nl.err))
			continue
		}
		for _, it := range nl.items {
			if keep == nil || keep(it.id) {
				items = append(items, it)
			}
		}
	}
	if len(failed) > 0 {
		writeError(w, http.StatusBadGateway, CodeNodeUnavailable, "cannot list every sandbox: "+strings.Join(failed, "; "))
		return
	}
	slices.SortFunc(items, func(a, b listItem) int {
		return cmp.Or(a.createdAt.Compare(b.createdAt), strings.Compare(a.id, b.id), strings.Compare(a.node, b.node))
	})
	writeJSON(w, http.StatusOK, pageOf(items, page, pageSize))
}

// missingNodes describes the nodes the ledger holds live OpenSandbox
// sandboxes on that cannot be listed now (not connected, or without the
// target), each with the reason: "node X holds live sandboxes but is not
// connected".
func (f *Facade) missingNodes(v fleetView) []string {
	seen := map[string]bool{}
	var out []string
	for _, rec := range f.cfg.Ledger.List(ledger.Filter{Provider: protocol.ProviderOpenSandbox, State: string(ledger.StateLive)}) {
		if seen[rec.Node] {
			continue
		}
		seen[rec.Node] = true
		if why := v.nodeReason(rec.Node); why != "" {
			out = append(out, fmt.Sprintf("node %s holds live sandboxes but %s", rec.Node, why))
		}
	}
	slices.Sort(out)
	return out
}

// skippable reports whether a fan-out (list, id lookup) may leave out node
// n, which failed with err: its lifecycle server cannot be dialed (err is
// a failed dial and the last dial in its session failed) and the ledger
// holds no live OpenSandbox sandbox on it, so it has nothing to
// contribute. One node's dead server must not fail every list.
func (f *Facade) skippable(n protocol.NodeInfo, err error) bool {
	var de *dialError
	if !errors.As(err, &de) || errors.Is(err, errClosed) || !f.tr.failing(n) {
		return false
	}
	return len(f.cfg.Ledger.List(ledger.Filter{Provider: protocol.ProviderOpenSandbox, Node: n.ID, State: string(ledger.StateLive)})) == 0
}

// listResponse is the facade's GET /sandboxes body: the node's items
// verbatim and the facade's own pagination.
type listResponse struct {
	Items      []json.RawMessage `json:"items"`
	Pagination osb.Pagination    `json:"pagination"`
}

// pageOf cuts page (from 1) of pageSize out of the sorted items.
func pageOf(items []listItem, page, pageSize int) listResponse {
	total := len(items)
	totalPages := (total + pageSize - 1) / pageSize
	out := listResponse{
		Items: []json.RawMessage{},
		Pagination: osb.Pagination{
			Page:        page,
			PageSize:    pageSize,
			TotalItems:  total,
			TotalPages:  totalPages,
			HasNextPage: page < totalPages,
		},
	}
	// start may wrap for a huge page, but is only used when page-1 < total,
	// where it cannot.
	if start := (page - 1) * pageSize; page-1 < total && start < total {
		end := min(start+pageSize, total)
		for _, it := range items[start:end] {
			out.Items = append(out.Items, it.raw)
		}
	}
	return out
}

// pagingParams reads page and pageSize as the server's schema does:
// integers, page ≥ 1 (default 1), 1 ≤ pageSize ≤ osb.MaxPageSize (default
// osb.DefaultPageSize); the last of repeated values counts. Violations are
// returned as FastAPI validation issues, all of them.
func pagingParams(q url.Values) (page, pageSize int, issues []osb.ValidationIssue) {
	page, pageSize = 1, osb.DefaultPageSize
	check := func(name string, dst *int, lo, hi int) {
		vals := q[name]
		if len(vals) == 0 {
			return
		}
		raw := vals[len(vals)-1]
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		switch {
		case err != nil:
			issues = append(issues, osb.ValidationIssue{
				Type: "int_parsing", Loc: []any{"query", name}, Input: raw,
				Msg: "Input should be a valid integer, unable to parse string as an integer",
			})
		case n < lo:
			issues = append(issues, osb.ValidationIssue{
				Type: "greater_than_equal", Loc: []any{"query", name}, Input: raw,
				Msg: fmt.Sprintf("Input should be greater than or equal to %d", lo), Ctx: map[string]any{"ge": lo},
			})
		case hi > 0 && n > hi:
			issues = append(issues, osb.ValidationIssue{
				Type: "less_than_equal", Loc: []any{"query", name}, Input: raw,
				Msg: fmt.Sprintf("Input should be less than or equal to %d", hi), Ctx: map[string]any{"le": hi},
			})
		default:
			*dst = n
		}
	}
	check("page", &page, 1, 0)
	check("pageSize", &pageSize, 1, osb.MaxPageSize)
	return page, pageSize, issues
}

// filterQuery returns the state and metadata parameters of rawQuery as the
// caller encoded them, joined with '&' ("" if none).
func filterQuery(rawQuery string) string {
	var keep []string
	for seg := range strings.SplitSeq(rawQuery, "&") {
		k, _, _ := strings.Cut(seg, "=")
		if key, err := url.QueryUnescape(k); err == nil && (key == "state" || key == "metadata") {
			keep = append(keep, seg)
		}
	}
	return strings.Join(keep, "&")
}

// listItem is one sandbox of a node's list, kept verbatim.
type listItem struct {
	node      string
	id        string
	createdAt time.Time
	raw       json.RawMessage
}

// nodeList is one node's whole list, or why there is none: err for a
// failure of the node, passStatus (with header and body) for a 4xx the
// caller gets verbatim.
type nodeList struct {
	node       string
	info       protocol.NodeInfo
	items      []listItem
	err        error
	passStatus int
	passHeader http.Header
	passBody   []byte
}

// nodePage is the part of a node's list page the facade reads.
type nodePage struct {
	Items      []json.RawMessage `json:"items"`
	Pagination osb.Pagination    `json:"pagination"`
}

// listOn reads every page of node n's list with filters.
func (f *Facade) listOn(ctx context.Context, r *http.Request, n protocol.NodeInfo, filters string) nodeList {
	nl := nodeList{node: n.ID, info: n}
	for page := 1; ; page++ {
		if page > maxListPages {
			nl.err = fmt.Errorf("more than %d pages of %d sandboxes", maxListPages, osb.MaxPageSize)
			return nl
		}
		q := "page=" + strconv.Itoa(page) + "&pageSize=" + strconv.Itoa(osb.MaxPageSize)
		if filters != "" {
			q = filters + "&" + q
		}
		resp, err := f.get(ctx, r, n, osb.VersionPrefix+osb.SandboxesPath+"?"+q, classList)
		if err != nil {
			nl.err = err
			return nl
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxListPageBody+1))
		resp.Body.Close()
		switch {
		case err != nil:
			nl.err = fmt.Errorf("read page %d: %w", page, err)
			return nl
		case len(body) > maxListPageBody:
			nl.err = fmt.Errorf("page %d is over %d bytes", page, maxListPageBody)
			return nl
		case resp.StatusCode >= 400 && resp.StatusCode < 500:
			nl.passStatus, nl.passHeader, nl.passBody = resp.StatusCode, resp.Header, body
			return nl
		case resp.StatusCode != http.StatusOK:
			nl.err = fmt.Errorf("page %d: answered %d %s", page, resp.StatusCode, snippet(body))
			return nl
		}
		var p nodePage
		if err := json.Unmarshal(body, &p); err != nil {
			nl.err = fmt.Errorf("decode page %d: %w", page, err)
			return nl
		}
		for i, raw := range p.Items {
			var it struct {
				ID        string    `json:"id"`
				CreatedAt time.Time `json:"createdAt"`
			}
			if err := json.Unmarshal(raw, &it); err != nil {
				nl.err = fmt.Errorf("decode page %d item %d: %w", page, i, err)
				return nl
			}
			nl.items = append(nl.items, listItem{node: n.ID, id: it.ID, createdAt: it.CreatedAt, raw: raw})
		}
		if !p.Pagination.HasNextPage {
			return nl
		}
		if len(p.Items) == 0 {
			nl.err = fmt.Errorf("page %d is empty but hasNextPage is true", page)
			return nl
		}
	}
}
