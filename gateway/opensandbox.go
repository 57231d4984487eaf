package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// OpenSandbox lists, gets and deletes the sandboxes of one OpenSandbox
// lifecycle server (wire-facts §2). The zero value is not usable: BaseURL
// is required. It holds no state besides its fields, which must not change
// while it is in use, and is safe for concurrent use.
type OpenSandbox struct {
	// HTTP sends the requests: over loopback (agent) or with a transport
	// that dials through a tunnel (coordinator). nil means
	// http.DefaultClient.
	HTTP *http.Client
	// BaseURL is the server's root, e.g. "http://127.0.0.1:8080"; a
	// trailing "/" or "/v1" is ignored. Requests go to <root>/v1/....
	BaseURL string
	// APIKey, when set, is sent in the OPEN-SANDBOX-API-KEY header.
	APIKey string
	// Metadata, when not empty, restricts List to sandboxes whose metadata
	// holds every pair (the server's metadata filter, re-checked here).
	Metadata map[string]string
}

// List geometry.
const (
	// openSandboxPageSize is the server's largest page.
	openSandboxPageSize = opensandbox.MaxPageSize
	// openSandboxMaxPages bounds the pages of one listing (200,000
	// sandboxes at the server's largest page).
	openSandboxMaxPages = 1000
	// openSandboxListTries bounds how often List restarts a listing whose
	// total changed between pages.
	openSandboxListTries = 3
	// maxOpenSandboxBody bounds a response body List, Get or Delete reads.
	maxOpenSandboxBody = 32 << 20
)

// errListChanged says the server's sandbox count changed while List paged.
var errListChanged = errors.New("the sandbox count changed between pages")

// List returns every sandbox of the server (matching Metadata, if set),
// paging GET /v1/sandboxes with pageSize 200 while hasNextPage. The server
// pages by position, so a sandbox deleted between two pages can hide
// another: when the reported total changes during a listing, List starts
// over, up to three times, and then returns what it saw with an error.
// Each sandbox is reported once. On any error the listing is incomplete
// (the sandboxes listed so far come with it) and absence from it means
// nothing.
func (o *OpenSandbox) List(ctx context.Context) ([]protocol.Sandbox, error) {
	var out []protocol.Sandbox
	var err error
	for range openSandboxListTries {
		out, err = o.list(ctx)
		if !errors.Is(err, errListChanged) {
			break
		}
	}
	if err != nil {
		return out, fmt.Errorf("opensandbox: list %s: %w", o.root(), err)
	}
	return out, nil
}

// list makes one pass over the pages.
func (o *OpenSandbox) list(ctx context.Context) ([]protocol.Sandbox, error) {
	var out []protocol.Sandbox
	seen := map[string]bool{}
	total := -1
	q := url.Values{"pageSize": {strconv.Itoa(openSandboxPageSize)}}
	if len(o.Metadata) > 0 {
		q.Set("metadata", opensandbox.EncodeMetadataFilter(o.Metadata))
	}
	for page := 1; ; page++ {
		q.Set("page", strconv.Itoa(page))
		var resp opensandbox.ListSandboxesResponse
		if err := o.do(ctx, http.MethodGet, "/v1/sandboxes?"+q.Encode(), &resp); err != nil {
			return out, fmt.Errorf("page %d: %w", page, err)
		}
		fresh := 0
		for _, sb := range resp.Items {
			if seen[sb.ID] {
				continue
			}
			seen[sb.ID] = true
			fresh++
			if opensandbox.MatchMetadata(sb.Metadata, o.Metadata) {
				out = append(out, OpenSandboxSandbox(sb))
			}
		}
		p := resp.Pagination
		switch {
		case p.HasNextPage && fresh == 0 && len(resp.Items) > 0:
			// A server that serves one page over and over (or only
			// sandboxes already listed) would keep the listing going
			// for as many pages as it claims.
			return out, fmt.Errorf("page %d of %d holds only sandboxes of earlier pages and claims a next one", page, p.TotalPages)
		case page >= openSandboxMaxPages && p.HasNextPage:
			return out, fmt.Errorf("page %d: more than %d pages of %d sandboxes", page, openSandboxMaxPages, openSandboxPageSize)
		case total >= 0 && p.TotalItems != total:
			return out, fmt.Errorf("page %d: %w (%d, then %d)", page, errListChanged, total, p.TotalItems)
		case !p.HasNextPage:
			return out, nil
		case page >= p.TotalPages:
			return out, fmt.Errorf("page %d of %d claims a next page", page, p.TotalPages)
		case len(resp.Items) == 0:
			return out, fmt.Errorf("page %d: empty page that claims a next one", page)
		}
		total = p.TotalItems
	}
}

// Get returns sandbox id. A 404 naming the sandbox is returned as
// ErrNotFound, wrapped.
func (o *OpenSandbox) Get(ctx context.Context, id string) (protocol.Sandbox, error) {
	var sb opensandbox.Sandbox
	if err := o.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), &sb); err != nil {
		return protocol.Sandbox{}, fmt.Errorf("opensandbox: get %s: %w", id, err)
	}
	return OpenSandboxSandbox(sb), nil
}

// Delete asks the server to delete sandbox id (204: it goes Stopping, then
// Terminated, then away). A 404 naming the sandbox is returned as
// ErrNotFound, wrapped: the sandbox is gone, so the delete is done.
func (o *OpenSandbox) Delete(ctx context.Context, id string) error {
	if err := o.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil); err != nil {
		return fmt.Errorf("opensandbox: delete %s: %w", id, err)
	}
	return nil
}

// root is BaseURL without a trailing "/" or "/v1".
func (o *OpenSandbox) root() string {
	return strings.TrimSuffix(strings.TrimRight(o.BaseURL, "/"), opensandbox.VersionPrefix)
}

// do sends one request and decodes a 2xx body into out (when out is not
// nil); any other status becomes an *OpenSandboxError.
func (o *OpenSandbox) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, o.root()+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if o.APIKey != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, o.APIKey)
	}
	hc := o.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxOpenSandboxBody+1))
	if err != nil {
		return fmt.Errorf("HTTP %d: read body: %w", resp.StatusCode, err)
	}
	if len(body) > maxOpenSandboxBody {
		return fmt.Errorf("HTTP %d: body over %d bytes", resp.StatusCode, maxOpenSandboxBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return newOpenSandboxError(resp.StatusCode, body)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("HTTP %d: decode body: %w", resp.StatusCode, err)
	}
	return nil
}

// OpenSandboxError is an error answer of an OpenSandbox server: its
// status and, for the server's flat {"code","message"} bodies, the code and
// message (for other bodies, such as FastAPI's 422 {"detail":[...]},
// Message holds the body's start).
type OpenSandboxError struct {
	Status  int
	Code    string
	Message string
}

func newOpenSandboxError(status int, body []byte) *OpenSandboxError {
	e := &OpenSandboxError{Status: status}
	var eb opensandbox.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Code != "" {
		e.Code, e.Message = eb.Code, eb.Message
		return e
	}
	e.Message = strings.TrimSpace(string(body[:min(len(body), 512)]))
	return e
}

func (e *OpenSandboxError) Error() string {
	s := "HTTP " + strconv.Itoa(e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is makes errors.Is(err, ErrNotFound) true for a 404 whose flat error
// body names a missing sandbox (a code ending in SANDBOX_NOT_FOUND, or a
// message containing "not found", which is NeMo Gym's test). A 404 without
// such a body, e.g. FastAPI's {"detail":"Not Found"} for a wrong base URL,
// is not ErrNotFound: taking it for "already deleted" would forget live
// sandboxes.
func (e *OpenSandboxError) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound && e.Code != "" &&
		(strings.HasSuffix(e.Code, "SANDBOX_NOT_FOUND") || strings.Contains(strings.ToLower(e.Message), "not found"))
}

// OpenSandboxSandbox converts a server's Sandbox to Tether's view: id,
// Labels = metadata, State = status.state verbatim (e.g. "Running"),
// CreatedAt and ExpiresAt in UTC (ExpiresAt zero when the sandbox never
// expires), Deleting when the state is Stopping or Terminated.
func OpenSandboxSandbox(sb opensandbox.Sandbox) protocol.Sandbox {
	s := protocol.Sandbox{
		Provider: protocol.ProviderOpenSandbox,
		ID:       sb.ID,
		State:    sb.Status.State,
		Deleting: sb.Status.State == opensandbox.StateStopping || sb.Status.State == opensandbox.StateTerminated,
	}
	if len(sb.Metadata) > 0 {
		s.Labels = maps.Clone(sb.Metadata)
	}
	if !sb.CreatedAt.IsZero() {
		s.CreatedAt = sb.CreatedAt.UTC()
	}
	if !sb.ExpiresAt.IsZero() {
		s.ExpiresAt = sb.ExpiresAt.UTC()
	}
	return s
}
