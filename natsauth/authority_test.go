package natsauth

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

func TestLoadCreatesThenLoads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	l1, err := Load(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("directory mode %04o, want 0700", perm)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		info, _ := e.Info()
		if perm := info.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", e.Name(), perm)
		}
	}
	want := "account-CLIENTS-client.nk account-CLIENTS.jwt account-CLIENTS.nk account-SYS.jwt account-SYS.nk account-TETHER.jwt account-TETHER.nk operator.jwt operator.nk"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("files:\n got %s\nwant %s", got, want)
	}

	l2, err := Load(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if l1.OperatorKey() != l2.OperatorKey() {
		t.Error("the operator key changed on reload")
	}
	for _, a := range accountNames {
		if l1.AccountKey(a) == "" || l1.AccountKey(a) != l2.AccountKey(a) {
			t.Errorf("account %s: key %q then %q", a, l1.AccountKey(a), l2.AccountKey(a))
		}
	}
	// A user minted before the reload is identified after it.
	alice := mintClient(t, l1, "alice")
	h := stamp(l2.AccountKey(AccountClients), alice.PublicKey(), alice.JWT, mustPublic(l2.clientSigner))
	if id, err := l2.Verifier().Identify(h); err != nil || id.Name != "alice" {
		t.Errorf("old user after reload: %+v, %v", id, err)
	}
}

// Loads racing on a fresh directory never mix keys: each either fails,
// saying another process is creating them, or loads the one set of keys.
func TestConcurrentLoads(t *testing.T) {
	for round := 0; round < 5; round++ {
		dir := filepath.Join(t.TempDir(), "keys")
		var wg sync.WaitGroup
		keys := make([]string, 8)
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := Load(dir, Config{})
				if err != nil {
					if !strings.Contains(err.Error(), "another process") && !strings.Contains(err.Error(), "incomplete") {
						t.Errorf("Load %d: %v", i, err)
					}
					return
				}
				keys[i] = l.OperatorKey() + l.AccountKey(AccountClients) + mustPublic(l.clientSigner)
			}()
		}
		wg.Wait()
		l, err := Load(dir, Config{})
		if err != nil {
			t.Fatalf("round %d: Load after the race: %v", round, err)
		}
		want := l.OperatorKey() + l.AccountKey(AccountClients) + mustPublic(l.clientSigner)
		for i, k := range keys {
			if k != "" && k != want {
				t.Errorf("round %d: Load %d got other keys than the directory holds", round, i)
			}
		}
	}
}

func TestLoadRefusesBadKeyDirectories(t *testing.T) {
	fresh := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "keys")
		if _, err := Load(dir, Config{}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tests := []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"group-readable seed", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "operator.nk"), 0o640)
		}, []string{filepath.Join("keys", "operator.nk"), "mode 0640", "chmod 600"}},
		{"world-readable seed", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "account-CLIENTS-client.nk"), 0o604)
		}, []string{"account-CLIENTS-client.nk", "mode 0604"}},
		{"missing seed", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "account-TETHER.nk"))
		}, []string{"incomplete", "but not account-TETHER.nk", "remove the directory"}},
		{"seed is a directory", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "account-SYS.nk")
			os.Remove(p)
			os.Mkdir(p, 0o700)
		}, []string{"account-SYS.nk", "not a regular file"}},
		{"wrong key type", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "account-SYS.nk"))
			os.WriteFile(filepath.Join(dir, "operator.nk"), b, 0o600)
		}, []string{"operator.nk", "holds an account key, want an operator key"}},
		{"garbage seed", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "account-TETHER.nk"), []byte("hello\n"), 0o600)
		}, []string{"account-TETHER.nk", "does not hold one NKey seed"}},
		{"CLIENTS JWT of another layout", func(t *testing.T, dir string) {
			other := testLayout(t, Config{})
			os.WriteFile(filepath.Join(dir, "account-CLIENTS.jwt"), []byte(other.AccountJWT(AccountClients)), 0o600)
		}, []string{"account-CLIENTS.jwt", "not account"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fresh(t)
			tt.break_(t, dir)
			_, err := Load(dir, Config{})
			if err == nil {
				t.Fatal("Load accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := Load(t.TempDir(), Config{ResponseThreshold: -1}); err == nil {
		t.Error("negative ResponseThreshold accepted")
	}
}

func TestLayoutJWTs(t *testing.T) {
	l := testLayout(t, Config{})
	op, err := jwt.DecodeOperatorClaims(l.OperatorJWT())
	if err != nil {
		t.Fatal(err)
	}
	if op.SystemAccount != l.AccountKey(AccountSYS) || op.Name != OperatorName {
		t.Errorf("operator: system account %s, name %s", op.SystemAccount, op.Name)
	}
	tether, err := jwt.DecodeAccountClaims(l.AccountJWT(AccountTether))
	if err != nil {
		t.Fatal(err)
	}
	if !tether.Limits.IsJSEnabled() {
		t.Error("TETHER has no JetStream")
	}
	exports := ServiceExports()
	if len(tether.Exports) != len(exports) {
		t.Fatalf("TETHER exports %d subjects, want %d", len(tether.Exports), len(exports))
	}
	// The JWT holds them sorted by subject.
	bySubject := map[string]ServiceExport{}
	for _, e := range exports {
		bySubject[e.Subject] = e
	}
	for i, x := range tether.Exports {
		e := bySubject[string(x.Subject)]
		want := jwt.ResponseType(jwt.ResponseTypeSingleton)
		if e.Streamed {
			want = jwt.ResponseTypeStream
		}
		if string(x.Subject) != e.Subject || x.Type != jwt.Service || x.ResponseType != want || x.ResponseThreshold != e.ResponseThreshold || x.TokenReq {
			t.Errorf("export %d: %+v, want %+v", i, x, e)
		}
	}
	clients, err := jwt.DecodeAccountClaims(l.AccountJWT(AccountClients))
	if err != nil {
		t.Fatal(err)
	}
	if clients.Limits.IsJSEnabled() {
		t.Error("CLIENTS has JetStream")
	}
	if !clients.Limits.DisallowBearer {
		t.Error("CLIENTS allows bearer tokens")
	}
	if len(clients.Imports) != len(exports) {
		t.Fatalf("CLIENTS imports %d subjects, want %d", len(clients.Imports), len(exports))
	}
	for i, im := range clients.Imports {
		if _, ok := bySubject[string(im.Subject)]; !ok || !im.Share || im.Account != l.AccountKey(AccountTether) || im.Type != jwt.Service || im.LocalSubject != "" {
			t.Errorf("import %d: %+v", i, im)
		}
	}
	sc, ok := clients.SigningKeys.GetScope(mustPublic(l.clientSigner))
	if us, _ := sc.(*jwt.UserScope); !ok || us == nil || us.Role != ClientRole || checkClientScope(us) != nil {
		t.Errorf("client signing key scope: %+v", sc)
	}
}

func TestMintNames(t *testing.T) {
	l := testLayout(t, Config{})
	for _, name := range []string{"", "-alice", "alice bob", "alice\n", strings.Repeat("a", 129), mustPublicUser(t)} {
		if _, err := l.MintClient(name, 0); err == nil {
			t.Errorf("MintClient(%q) accepted", name)
		}
	}
	for _, name := range []string{"alice", "ci.bot@example.com", "a+b-c_d", strings.Repeat("a", 128)} {
		c, err := l.MintClient(name, 0)
		if err != nil {
			t.Errorf("MintClient(%q): %v", name, err)
			continue
		}
		if c.Name() != name || !nkeys.IsValidPublicUserKey(c.PublicKey()) {
			t.Errorf("minted %q as %q %q", name, c.Name(), c.PublicKey())
		}
	}
	if _, err := l.MintClient("alice", -1); err == nil {
		t.Error("negative ttl accepted")
	}
	if _, err := l.MintCoordinator("c 1"); err == nil {
		t.Error("MintCoordinator accepted a bad name")
	}
}

func TestConfigureServerRefusesConflicts(t *testing.T) {
	l := testLayout(t, Config{})
	for name, o := range map[string]*server.Options{
		"Users":         {Users: []*server.User{{Username: "a"}}},
		"Nkeys":         {Nkeys: []*server.NkeyUser{{Nkey: "U"}}},
		"Accounts":      {Accounts: []*server.Account{server.NewAccount("A")}},
		"NoAuthUser":    {NoAuthUser: "a"},
		"Username":      {Username: "a", Password: "b"},
		"Authorization": {Authorization: "token"},
		"TrustedKeys":   {TrustedKeys: []string{"O"}},
		"SystemAccount": {SystemAccount: "$SYS"},
	} {
		if err := l.ConfigureServer(o); err == nil || !strings.Contains(err.Error(), strings.SplitN(name, "/", 2)[0]) {
			t.Errorf("%s: %v", name, err)
		}
	}
	o := &server.Options{}
	if err := l.ConfigureServer(o); err != nil {
		t.Fatal(err)
	}
	if o.SystemAccount != l.AccountKey(AccountSYS) || len(o.TrustedOperators) != 1 || o.AccountResolver == nil {
		t.Errorf("options: %+v", o)
	}
	for _, a := range accountNames {
		if got, err := o.AccountResolver.Fetch(l.AccountKey(a)); err != nil || got != l.AccountJWT(a) {
			t.Errorf("resolver has no JWT for %s: %v", a, err)
		}
	}
}

func TestPipeSubject(t *testing.T) {
	id := NewPipeID()
	if len(id) != 26 || checkToken(id) != nil {
		t.Fatalf("pipe id %q", id)
	}
	if NewPipeID() == id {
		t.Fatal("two equal pipe ids")
	}
	s, err := PipeSubject("c1", id)
	if err != nil || s != "tether.v1.pipe.c1."+id {
		t.Fatalf("%s, %v", s, err)
	}
	for _, bad := range [][2]string{{"", id}, {"c.1", id}, {"c1", "a>"}, {"c1", "*"}, {"c1", ""}, {strings.Repeat("c", 65), id}} {
		if _, err := PipeSubject(bad[0], bad[1]); err == nil {
			t.Errorf("PipeSubject(%q, %q) accepted", bad[0], bad[1])
		}
	}
}
