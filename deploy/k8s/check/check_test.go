package check

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// installs are the kustomizations users apply, relative to the root.
var installs = []string{".", "ha"}

// root is the manifest directory: $TETHER_K8S_DIR, else the parent.
func root(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("TETHER_K8S_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// external returns the ConfigMaps the operator creates: the NATS layout
// include from $TETHER_NATS_LAYOUT (`tether nats server-config`; `make
// k8s-check` writes one). Without it the test is skipped, never passed.
func external(t *testing.T) External {
	t.Helper()
	p := os.Getenv("TETHER_NATS_LAYOUT")
	if p == "" {
		t.Skip("TETHER_NATS_LAYOUT is not set: run make k8s-check (it writes a layout with tether nats server-config)")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("TETHER_NATS_LAYOUT: %v", err)
	}
	if !strings.Contains(string(b), "operator:") {
		t.Fatalf("TETHER_NATS_LAYOUT %s has no operator: is it tether nats server-config's output?", p)
	}
	return External{"tether-nats-layout": {
		"tether-layout.conf": string(b),
		// Public JWTs the coordinators read; their contents do not matter here.
		"operator.jwt": "stand-in", "clients.jwt": "stand-in",
	}}
}

func load(t *testing.T, dir string) *Install {
	t.Helper()
	in, err := LoadInstall(root(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// checkInstall runs every check of the NATS property on in and returns the
// servers and the errors.
func checkInstall(t *testing.T, in *Install, ext External) ([]NATSServer, []error) {
	t.Helper()
	servers, errs := LoadNATSServers(in, ext, t.TempDir(), t.Setenv)
	for _, s := range servers {
		errs = append(errs, CheckNATSServer(s)...)
	}
	ports, cerrs := CheckCoordinators(in, servers)
	errs = append(errs, cerrs...)
	errs = append(errs, CheckNATSExposure(in, append(ports, ServerPorts(servers)...))...)
	return servers, errs
}

// Every manifest decodes strictly, belongs to an install, and every install
// resolves its references.
func TestManifestsDecodeAndResolve(t *testing.T) {
	r := root(t)
	inFiles := map[string]bool{}
	for _, dir := range installs {
		in := load(t, dir)
		if len(in.Objects) == 0 {
			t.Errorf("install %s has no objects", dir)
		}
		for _, err := range CheckReferences(in) {
			t.Errorf("install %s: %v", dir, err)
		}
		for _, f := range in.Files {
			inFiles[f] = true
		}
	}
	err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(r, p)
		if d.IsDir() && rel == "check" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml") {
			return nil
		}
		// Each file decodes on its own too (a file no install lists is
		// reported below, but must not hide a decoding error either).
		if _, err := LoadFile(r, rel); err != nil {
			t.Error(err)
		}
		if !inFiles[rel] {
			t.Errorf("%s is in no install (%s): list it in a kustomization.yaml or remove it", rel, strings.Join(installs, ", "))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Prometheus can scrape every coordinator and agent of every install: the
// metrics flag set, its port declared and annotated as the coordinators'
// are (an agent DaemonSet without --metrics-addr exported nothing).
func TestMetricsScrapable(t *testing.T) {
	for _, dir := range installs {
		for _, err := range CheckScrape(load(t, dir)) {
			t.Errorf("install %s: %v", dir, err)
		}
	}
}

// The HA install is what issue 13 asks for: an agent DaemonSet, several
// coordinators, and a three-server NATS cluster with JetStream and routes.
func TestHAInstallShape(t *testing.T) {
	in := load(t, "ha")
	var ds, coords, nats int
	for _, w := range in.Workloads() {
		for _, c := range w.Template.Spec.Containers {
			switch v := w.Value.(type) {
			case *appsv1.DaemonSet:
				if strings.Contains(c.Image, "tether/agent") {
					ds++
				}
			case *appsv1.Deployment:
				if isCoordinator(c) && v.Spec.Replicas != nil {
					coords += int(*v.Spec.Replicas)
				}
			case *appsv1.StatefulSet:
				if isNATSServer(c) && v.Spec.Replicas != nil {
					nats += int(*v.Spec.Replicas)
				}
			}
		}
	}
	if ds != 1 || coords < 2 || nats != 3 {
		t.Fatalf("ha: %d agent DaemonSets (want 1), %d coordinators (want >= 2), %d NATS servers (want 3)", ds, coords, nats)
	}
	servers, errs := checkInstall(t, in, external(t))
	for _, err := range errs {
		t.Error(err)
	}
	if len(servers) != 1 {
		t.Fatalf("%d nats-server containers, want 1 (the StatefulSet's)", len(servers))
	}
	o := servers[0].Opts
	if !o.JetStream || o.StoreDir == "" {
		t.Errorf("JetStream off (%v) or no store_dir (%q)", o.JetStream, o.StoreDir)
	}
	if o.PingInterval > 5*time.Second || o.MaxPingsOut > 3 {
		t.Errorf("ping_interval %v, ping_max %d: a silent coordinator keeps its share of the queue group that long (README: 2s, 2)", o.PingInterval, o.MaxPingsOut)
	}
	if len(o.Routes) != 3 {
		t.Errorf("%d routes, want one per server (3)", len(o.Routes))
	}
	for _, r := range o.Routes {
		if !strings.HasSuffix(r.Hostname(), ".tether-nats-cluster.tether.svc") {
			t.Errorf("route %s is not a name of the headless Service tether-nats-cluster", redact(r))
		}
	}
}

// No NATS port of any install admits a connection without credentials,
// by the configuration, by the NetworkPolicies and on the wire.
func TestNoAnonymousNATS(t *testing.T) {
	ext := external(t)
	for _, dir := range installs {
		t.Run(dir, func(t *testing.T) {
			in := load(t, dir)
			servers, errs := checkInstall(t, in, ext)
			for _, err := range errs {
				t.Error(err)
			}
			for _, s := range servers {
				if err := ProbeAnonymous(s, t.TempDir()); err != nil {
					t.Errorf("%s: %v", s.Workload.Where(), err)
				}
			}
		})
	}
}

// The strict decoder refuses what kubectl would refuse or silently drop.
func TestDecodeStrictRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {}\n",
		"misspelt field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      contianers: []\n",
		"wrong type":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: {name: a}\n",
		"duplicate key":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown kind":   "apiVersion: v1\nkind: Gadget\nmetadata: {name: x}\n",
		"no kind":        "metadata: {name: x}\n",
	} {
		if _, err := DecodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	if v, err := DecodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")); err != nil || v.(*corev1.ConfigMap).Data["a"] != "b" {
		t.Errorf("a valid ConfigMap: %v, %v", v, err)
	}
}

// Each way of opening a NATS port is caught: the checks fail on these
// mutations of the HA install's NATS config.
func TestNATSChecksCatchMutations(t *testing.T) {
	ext := external(t)
	for name, mutate := range map[string]func(string) string{
		"no_auth_user": func(c string) string { return c + "\nno_auth_user: anyone\n" },
		"no layout": func(c string) string {
			return strings.Replace(c, "include ./layout/tether-layout.conf", "", 1)
		},
		"monitoring port": func(c string) string { return c + "\nhttp: 0.0.0.0:8222\n" },
		"leafnodes":       func(c string) string { return c + "\nleafnodes { port: 7422 }\n" },
		"websocket":       func(c string) string { return c + "\nwebsocket { port: 8080, no_tls: true }\n" },
		"route without credentials": func(c string) string {
			return strings.Replace(c, "\n    $ROUTE_0\n", "\n    nats://tether-nats-0.tether-nats-cluster.tether.svc:6222\n", 1)
		},
		"cluster without authorization": func(c string) string {
			i := strings.Index(c, "  authorization {")
			j := strings.Index(c[i:], "}\n") + i + 2
			return c[:i] + c[j:]
		},
	} {
		t.Run(name, func(t *testing.T) {
			in := load(t, "ha")
			cm := findConfigMap(t, in, "tether-nats-config")
			before := cm.Data["nats.conf"]
			cm.Data["nats.conf"] = mutate(before)
			if cm.Data["nats.conf"] == before {
				t.Fatal("the mutation changed nothing: the manifest no longer has what it edits")
			}
			_, errs := checkInstall(t, in, ext)
			if len(errs) == 0 {
				t.Fatal("no check failed")
			}
			t.Logf("caught: %v", errors.Join(errs...))
		})
	}
}

// Each way of fencing a NATS port badly is caught.
func TestExposureChecksCatchMutations(t *testing.T) {
	ext := external(t)
	for name, c := range map[string]struct {
		dir    string
		mutate func(t *testing.T, in *Install)
	}{
		"ha: no NetworkPolicy for NATS": {"ha", func(t *testing.T, in *Install) {
			in.Objects = slices.DeleteFunc(in.Objects, func(o Object) bool { return o.Kind == "NetworkPolicy" && o.Name == "tether-nats" })
		}},
		"ha: client port from anywhere": {"ha", func(t *testing.T, in *Install) {
			findPolicy(t, in, "tether-nats").Spec.Ingress[0].From = nil
		}},
		"ha: client port from whole namespaces": {"ha", func(t *testing.T, in *Install) {
			p := findPolicy(t, in, "tether-nats")
			p.Spec.Ingress[0].From[1].PodSelector = nil
		}},
		"ha: NodePort": {"ha", func(t *testing.T, in *Install) {
			o, _ := in.Find("Service", "tether-nats")
			o.Value.(*corev1.Service).Spec.Type = corev1.ServiceTypeNodePort
		}},
		"ha: insecure coordinator": {"ha", func(t *testing.T, in *Install) {
			o, _ := in.Find("Deployment", "tether-coordinator")
			c := &o.Value.(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--insecure-nats")
		}},
		"single: embedded NATS port from anywhere": {".", func(t *testing.T, in *Install) {
			p := findPolicy(t, in, "tether-coordinator")
			p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{})
		}},
		"single: no NetworkPolicy": {".", func(t *testing.T, in *Install) {
			in.Objects = slices.DeleteFunc(in.Objects, func(o Object) bool { return o.Kind == "NetworkPolicy" })
		}},
	} {
		t.Run(name, func(t *testing.T) {
			in := load(t, c.dir)
			if _, errs := checkInstall(t, in, ext); len(errs) != 0 {
				t.Fatalf("the unmutated install fails already: %v", errors.Join(errs...))
			}
			c.mutate(t, in)
			_, errs := checkInstall(t, in, ext)
			if len(errs) == 0 {
				t.Fatal("no check failed")
			}
			t.Logf("caught: %v", errors.Join(errs...))
		})
	}
}

// The reference checks catch a broken selector and an undeclared volume.
func TestReferenceChecksCatchMutations(t *testing.T) {
	in := load(t, "ha")
	o, _ := in.Find("Service", "tether-nats")
	o.Value.(*corev1.Service).Spec.Selector = map[string]string{"app.kubernetes.io/component": "natz"}
	d, _ := in.Find("Deployment", "tether-coordinator")
	spec := &d.Value.(*appsv1.Deployment).Spec.Template.Spec
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "node-ca" })
	errs := CheckReferences(in)
	joined := errors.Join(errs...)
	if joined == nil || !strings.Contains(joined.Error(), "selects no pod") || !strings.Contains(joined.Error(), `undeclared volume "node-ca"`) {
		t.Fatalf("errors %v, want a selector and a volume error", joined)
	}
}

func findConfigMap(t *testing.T, in *Install, name string) *corev1.ConfigMap {
	t.Helper()
	o, ok := in.Find("ConfigMap", name)
	if !ok {
		t.Fatalf("no ConfigMap %s", name)
	}
	return o.Value.(*corev1.ConfigMap)
}

func findPolicy(t *testing.T, in *Install, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	o, ok := in.Find("NetworkPolicy", name)
	if !ok {
		t.Fatalf("no NetworkPolicy %s", name)
	}
	return o.Value.(*networkingv1.NetworkPolicy)
}

// The wire probe is no formality: a server of the HA config with its
// layout include and route authorization taken out answers an anonymous
// client, and the probe says so.
func TestProbeCatchesAnonymous(t *testing.T) {
	ext := external(t)
	in := load(t, "ha")
	cm := findConfigMap(t, in, "tether-nats-config")
	c := strings.Replace(cm.Data["nats.conf"], "include ./layout/tether-layout.conf", "", 1)
	i := strings.Index(c, "  authorization {")
	j := strings.Index(c[i:], "}\n") + i + 2
	cm.Data["nats.conf"] = c[:i] + c[j:]
	servers, _ := LoadNATSServers(in, ext, t.TempDir(), t.Setenv)
	if len(servers) != 1 {
		t.Fatalf("%d servers, want 1", len(servers))
	}
	err := ProbeAnonymous(servers[0], t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "admits anonymous") && !strings.Contains(err.Error(), "auth_required false") {
		t.Fatalf("probe of an open server: %v, want it to report anonymous access", err)
	}
	t.Logf("caught: %v", err)
}
