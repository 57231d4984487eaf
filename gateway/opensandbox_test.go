package gateway_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

const osbKey = "k-1"

// createOSB creates a sandbox on the fake through its API.
func createOSB(t *testing.T, s *opensandboxtest.Server, md map[string]string) opensandbox.CreateSandboxResponse {
	t.Helper()
	timeout := 600
	body, _ := json.Marshal(opensandbox.CreateSandboxRequest{
		Image: &opensandbox.ImageSpec{URI: "python:3.12"}, Entrypoint: []string{"tail", "-f", "/dev/null"}, Timeout: &timeout, Metadata: md,
	})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set(opensandbox.HeaderAPIKey, osbKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out opensandbox.CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	return out
}

func TestOpenSandboxListPagesAndFilter(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: osbKey})
	want := map[string]bool{}
	for i := range 450 {
		run := "run-a"
		if i%10 == 0 {
			run = "run-b"
		}
		sb := createOSB(t, s, map[string]string{"nemo-gym.nvidia.com/run": run, "i": fmt.Sprint(i)})
		want[sb.ID] = true
	}

	o := &gateway.OpenSandbox{BaseURL: s.URL + "/v1/", APIKey: osbKey}
	got, err := o.List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d, want %d", len(got), len(want))
	}
	for _, sb := range got {
		if !want[sb.ID] {
			t.Fatalf("unexpected or repeated %s", sb.ID)
		}
		delete(want, sb.ID)
		if sb.Provider != protocol.ProviderOpenSandbox || sb.State != opensandbox.StateRunning || sb.Labels["i"] == "" ||
			sb.CreatedAt.IsZero() || sb.ExpiresAt.Sub(sb.CreatedAt) != 600*time.Second || sb.Deleting || sb.Name != "" {
			t.Fatalf("bad mapping %+v", sb)
		}
	}
	var pages []string
	for _, r := range s.Requests() {
		if r.Method == http.MethodGet && r.Path == "/v1/sandboxes" {
			q, _ := url.ParseQuery(r.RawQuery)
			if q.Get("pageSize") != "200" || r.Header.Get(opensandbox.HeaderAPIKey) != osbKey {
				t.Errorf("list request %s, key %q", r.RawQuery, r.Header.Get(opensandbox.HeaderAPIKey))
			}
			pages = append(pages, q.Get("page"))
		}
	}
	if fmt.Sprint(pages) != "[1 2 3]" {
		t.Errorf("pages requested %v", pages)
	}

	// The metadata filter goes to the server (OSB-2's encoding).
	o.Metadata = map[string]string{"nemo-gym.nvidia.com/run": "run-b"}
	got, err = o.List(ctxFor(t))
	if err != nil || len(got) != 45 {
		t.Fatalf("filtered listing: %d, %v", len(got), err)
	}
	last := s.Requests()[len(s.Requests())-1]
	if q, _ := url.ParseQuery(last.RawQuery); q.Get("metadata") != "nemo-gym.nvidia.com/run=run-b" {
		t.Errorf("filter sent as %q", last.RawQuery)
	}
}

func TestOpenSandboxListRestartsOnChurnAndReportsFailures(t *testing.T) {
	var mu sync.Mutex
	var deleteOnPage2, failPage2 int
	var ids []string // in creation order, which is the fake's list order
	var s *opensandboxtest.Server
	s = opensandboxtest.Start(t, opensandboxtest.Config{Intercept: func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || r.URL.Query().Get("page") != "2" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if failPage2 > 0 {
			failPage2--
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"code":"INTERNAL","message":"boom"}`))
			return true
		}
		if deleteOnPage2 > 0 {
			deleteOnPage2--
			// Delete the oldest sandbox: every later one shifts back a
			// place, so page 2 would skip one.
			if err := (&gateway.OpenSandbox{BaseURL: s.URL}).Delete(t.Context(), ids[0]); err != nil {
				t.Error(err)
			}
			ids = ids[1:]
		}
		return false
	}})
	for range 250 {
		id := createOSB(t, s, nil).ID
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	}
	o := &gateway.OpenSandbox{BaseURL: s.URL}

	mu.Lock()
	deleteOnPage2 = 1
	mu.Unlock()
	got, err := o.List(ctxFor(t))
	if err != nil || len(got) != 249 {
		t.Fatalf("after churn: %d, %v", len(got), err)
	}
	mu.Lock()
	for i, sb := range got {
		if sb.ID != ids[i] {
			t.Fatalf("after churn: row %d is %s, want %s", i, sb.ID, ids[i])
		}
	}
	mu.Unlock()

	mu.Lock()
	deleteOnPage2 = 10
	mu.Unlock()
	if _, err := o.List(ctxFor(t)); err == nil {
		t.Fatal("a listing that never settles reported complete")
	}

	mu.Lock()
	deleteOnPage2, failPage2 = 0, 1
	mu.Unlock()
	part, err := o.List(ctxFor(t))
	var oe *gateway.OpenSandboxError
	if !errors.As(err, &oe) || oe.Status != http.StatusInternalServerError || oe.Code != "INTERNAL" || len(part) != 200 {
		t.Fatalf("failed page 2: %d rows, %v", len(part), err)
	}
}

func TestOpenSandboxGetDelete(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: osbKey})
	sb := createOSB(t, s, map[string]string{"team": "a"})
	o := &gateway.OpenSandbox{BaseURL: s.URL, APIKey: osbKey}

	got, err := o.Get(ctxFor(t), sb.ID)
	want := protocol.Sandbox{Provider: protocol.ProviderOpenSandbox, ID: sb.ID, Labels: map[string]string{"team": "a"},
		State: opensandbox.StateRunning, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt}
	if err != nil || !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Get = %+v, want %+v", got, want)
	}
	for _, state := range []string{opensandbox.StateStopping, opensandbox.StateTerminated} {
		s.SetState(sb.ID, state, opensandbox.ReasonUserDelete)
		if got, _ := o.Get(ctxFor(t), sb.ID); !got.Deleting || got.State != state {
			t.Errorf("state %s: %+v", state, got)
		}
	}

	if err := o.Delete(ctxFor(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := o.Delete(ctxFor(t), sb.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := o.Get(ctxFor(t), sb.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}
	// A 404 from a wrong base URL is not "sandbox gone".
	bad := &gateway.OpenSandbox{BaseURL: s.URL + "/nope", APIKey: osbKey}
	if err := bad.Delete(ctxFor(t), "x"); err == nil || errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("delete via a wrong base URL: %v", err)
	}
	// Auth failures name the server's code.
	var oe *gateway.OpenSandboxError
	if _, err := (&gateway.OpenSandbox{BaseURL: s.URL, APIKey: "wrong"}).List(ctxFor(t)); !errors.As(err, &oe) || oe.Code != opensandbox.CodeInvalidAPIKey {
		t.Errorf("wrong key: %v", err)
	}
}
