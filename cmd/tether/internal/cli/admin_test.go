package cli

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// checkServerLimits fails unless srv bounds every wait a client can make it
// do and the size of a request's headers.
func checkServerLimits(t *testing.T, name string, srv *http.Server) {
	t.Helper()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("%s: ReadHeaderTimeout %v, ReadTimeout %v, WriteTimeout %v, IdleTimeout %v; want all set",
			name, srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("%s: MaxHeaderBytes %d, want set and at most 64 KiB (net/http's default is 1 MiB)", name, srv.MaxHeaderBytes)
	}
}

// The coordinator's admin server sheds idle keep-alive connections and
// bounds every read, write and header.
func TestCoordinatorAdminServerLimits(t *testing.T) {
	cs, err := startCoordinator(testCoordinatorOptions(t, t.TempDir()), "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	checkServerLimits(t, "coordinator admin server", cs.admin)
}
