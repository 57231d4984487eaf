//go:build !tetherclient

package cli

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/internal/sdnotify"
)

// loadLocalPolicy loads the agent's local policy: the file flag names, or
// localpolicy.DefaultPath when flag is empty. A missing default file means
// no local policy (nil, ""); a missing named file, and any file that is
// bad or unsafe, is an error. path is the file to reload on SIGHUP.
func loadLocalPolicy(flag string) (p *localpolicy.Policy, path string, err error) {
	path = flag
	if path == "" {
		path = localpolicy.DefaultPath
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, path, nil
		}
	}
	p, err = localpolicy.Load(path)
	if err != nil {
		return nil, "", err
	}
	return p, path, nil
}

// watchLocalPolicy reloads the local policy at path (as flag names it:
// loadLocalPolicy) into a on every SIGHUP until ctx ends or stop is
// called; stop waits for its goroutine. It is watchAgentReload without a
// config file.
func watchLocalPolicy(ctx context.Context, a *agent.Agent, path, flag string, notify *sdnotify.Notifier, log *slog.Logger) (stop func()) {
	return watchAgentReload(ctx, a, path, flag, nil, notify, log)
}

// watchAgentReload is the agent's SIGHUP: with a config file (src
// non-nil) it first re-reads that, which may name another local-policy
// file (configreload.go), then it reloads the local policy. A file that
// fails to load keeps the policy in force (logged as an error), so a typo
// cannot lift the node's restrictions; a default file that is still absent
// keeps "none". Each reload is announced to systemd (RELOADING=1, then
// READY=1 with the outcome as STATUS=) through notify, once the agent is
// ready; nil notify sends nothing.
func watchAgentReload(ctx context.Context, a *agent.Agent, path, flag string, src *configSource, notify *sdnotify.Notifier, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	reloadsOnHangup()
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			err := notify.Reload(func() string {
				next, live, cstatus := flag, []configChange(nil), ""
				if src != nil {
					next, live, cstatus = reloadAgentConfig(src, flag, log)
					cstatus += "; "
				}
				p, npath, err := loadLocalPolicy(next)
				switch {
				case err != nil:
					log.Error("local policy not reloaded; the one in force stays", "file", orDefault(next, path), "err", err)
					return cstatus + "local policy not reloaded (the one in force stays): " + err.Error()
				case p == nil:
					log.Info("no local policy to reload", "file", npath)
				default:
					a.SetLocalPolicy(p)
					log.Info("local policy reloaded", "file", npath)
				}
				flag, path = next, npath
				if src != nil {
					src.commit(live)
				}
				if p == nil {
					return cstatus + "no local policy to reload at " + npath
				}
				return cstatus + "local policy reloaded from " + npath
			})
			if err != nil {
				log.Warn("systemd notification failed", "err", err)
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}
}

// orDefault is s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
