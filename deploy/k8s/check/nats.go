package check

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// NATSServer is one nats-server container of an install, with its
// configuration as nats-server itself parses it.
type NATSServer struct {
	Workload  Workload
	Container corev1.Container
	// ConfigPath is the --config file inside the container; Text is its
	// contents (from the install's ConfigMap).
	ConfigPath, Text string
	// Dir is the temporary directory the container's configuration mounts
	// were written to (ConfigPath is Dir+ConfigPath there).
	Dir string
	// Opts is what server.ProcessConfigFile made of it, with the
	// container's environment.
	Opts *server.Options
}

// External supplies ConfigMaps an install expects to exist (created by the
// operator, README.md) by name, key and contents: the NATS layout include.
type External map[string]map[string]string

// imageName returns an image reference's repository without registry and
// tag: "docker.io/library/nats:2.15-alpine" -> "nats".
func imageName(image string) string {
	if i := strings.IndexAny(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return path.Base(image)
}

// isNATSServer reports whether c runs nats-server (the official image).
func isNATSServer(c corev1.Container) bool {
	return imageName(c.Image) == "nats" || slices0(c.Command) == "nats-server"
}

func slices0(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return path.Base(s[0])
}

// isCoordinator reports whether c runs `tether coordinator` (the
// coordinator image's entrypoint).
func isCoordinator(c corev1.Container) bool {
	repo := c.Image
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return strings.HasSuffix(repo, "tether/coordinator")
}

// flagValue returns the value of --name=V or --name V in args, and whether
// it is there.
func flagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			if v, ok := strings.CutPrefix(a, n+"="); ok {
				return v, true
			}
			if a == n && i+1 < len(args) {
				return args[i+1], true
			}
		}
	}
	return "", false
}

// varRef is a Kubernetes dependent environment variable reference.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// containerEnv resolves c's environment as the kubelet would, with
// stand-ins for what only a cluster knows: a Secret key becomes a fixed
// hex string, the pod name the workload's first pod's.
func containerEnv(w Workload, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = varRef.ReplaceAllStringFunc(e.Value, func(m string) string {
				if v, ok := env[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "0123456789abcdef0123456789abcdef"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = w.Name + "-0"
		default:
			env[e.Name] = "stand-in"
		}
	}
	return env
}

// LoadNATSServers finds the install's nats-server containers, writes the
// ConfigMaps they mount (the install's, else ext's) into a directory under
// tmp, and parses each --config with nats-server's own parser, with the
// container's environment set through setenv (t.Setenv).
func LoadNATSServers(in *Install, ext External, tmp string, setenv func(k, v string)) ([]NATSServer, []error) {
	var out []NATSServer
	var errs []error
	for _, w := range in.Workloads() {
		for _, c := range w.Template.Spec.Containers {
			if !isNATSServer(c) {
				continue
			}
			s, err := loadNATSServer(in, ext, w, c, tmp, setenv)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: container %q: %w", w.Where(), c.Name, err))
				continue
			}
			out = append(out, s)
		}
	}
	return out, errs
}

func loadNATSServer(in *Install, ext External, w Workload, c corev1.Container, tmp string, setenv func(k, v string)) (NATSServer, error) {
	s := NATSServer{Workload: w, Container: c}
	args := append(append([]string(nil), c.Command...), c.Args...)
	conf, ok := flagValue(args, "--config", "-c")
	if !ok {
		return s, errors.New("no --config: nats-server without a config file has no authorization at all")
	}
	s.ConfigPath = conf
	dir, err := os.MkdirTemp(tmp, "nats-")
	if err != nil {
		return s, err
	}
	s.Dir = dir
	vols := map[string]corev1.Volume{}
	for _, v := range w.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v.ConfigMap == nil {
			continue
		}
		data, err := configMapData(in, ext, v.ConfigMap.Name)
		if err != nil {
			return s, fmt.Errorf("volume %q: %w", m.Name, err)
		}
		files := map[string]string{}
		if len(v.ConfigMap.Items) == 0 {
			for k, val := range data {
				files[k] = val
			}
		}
		for _, it := range v.ConfigMap.Items {
			val, ok := data[it.Key]
			if !ok {
				return s, fmt.Errorf("volume %q: ConfigMap %s has no key %q", m.Name, v.ConfigMap.Name, it.Key)
			}
			files[it.Path] = val
		}
		for name, val := range files {
			p := filepath.Join(dir, m.MountPath, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return s, err
			}
			if err := os.WriteFile(p, []byte(val), 0o600); err != nil {
				return s, err
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, conf))
	if err != nil {
		return s, fmt.Errorf("--config %s is in no mounted ConfigMap: %w", conf, err)
	}
	s.Text = string(b)
	for k, v := range containerEnv(w, c) {
		setenv(k, v)
	}
	s.Opts, err = server.ProcessConfigFile(filepath.Join(dir, conf))
	if err != nil {
		return s, fmt.Errorf("nats-server cannot parse %s: %w", conf, err)
	}
	return s, nil
}

// configMapData returns the data of ConfigMap name: the install's, else
// the external one.
func configMapData(in *Install, ext External, name string) (map[string]string, error) {
	if o, ok := in.Find("ConfigMap", name); ok {
		return o.Value.(*corev1.ConfigMap).Data, nil
	}
	if d, ok := ext[name]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("ConfigMap %s is neither in the install nor supplied", name)
}

// noAuthUser matches the option in any of nats-server's spellings.
var noAuthUser = regexp.MustCompile(`(?mi)^\s*no_auth_user\s*[:=\s]`)

// CheckNATSServer returns every way s admits a connection without
// credentials: no operator (the layout include) or an anonymous default
// user; a monitoring, leafnode, gateway, websocket or MQTT listener; a
// cluster port without route authorization, or a route URL without it; a
// container port that is not the client or cluster port.
func CheckNATSServer(s NATSServer) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: container %q (%s): %s", s.Workload.Where(), s.Container.Name, s.ConfigPath, fmt.Sprintf(format, args...)))
	}
	o := s.Opts
	if noAuthUser.MatchString(s.Text) || o.NoAuthUser != "" {
		bad("no_auth_user lets connections without credentials in")
	}
	if len(o.TrustedOperators) == 0 {
		bad("no operator: the server does not enforce Tether's layout (include `tether nats server-config`)")
	}
	if len(o.Users) > 0 || len(o.Nkeys) > 0 || o.Username != "" || o.Authorization != "" {
		bad("an authorization block beside the operator: the layout must be the only way in")
	}
	if o.SystemAccount == "" {
		bad("no system_account")
	}
	if o.HTTPPort != 0 || o.HTTPSPort != 0 {
		bad("a monitoring port (%d/%d): NATS's HTTP monitoring has no authentication", o.HTTPPort, o.HTTPSPort)
	}
	if o.LeafNode.Port != 0 {
		bad("a leafnode listener on %d", o.LeafNode.Port)
	}
	if o.Gateway.Port != 0 {
		bad("a gateway listener on %d", o.Gateway.Port)
	}
	if o.Websocket.Port != 0 {
		bad("a websocket listener on %d", o.Websocket.Port)
	}
	if o.MQTT.Port != 0 {
		bad("an MQTT listener on %d", o.MQTT.Port)
	}
	if o.Cluster.Port != 0 {
		if o.Cluster.Username == "" || o.Cluster.Password == "" {
			bad("cluster port %d without authorization (user and password)", o.Cluster.Port)
		}
		if len(o.Routes) == 0 {
			bad("cluster port %d but no routes", o.Cluster.Port)
		}
		for _, r := range o.Routes {
			pass, _ := r.User.Password()
			if r.User == nil || r.User.Username() != o.Cluster.Username || pass != o.Cluster.Password {
				bad("route %s does not carry the cluster's credentials", redact(r))
			}
		}
	}
	allowed := map[int32]bool{int32(o.Port): true}
	if o.Cluster.Port != 0 {
		allowed[int32(o.Cluster.Port)] = true
	}
	for _, p := range s.Container.Ports {
		if !allowed[p.ContainerPort] {
			bad("container port %d (%s) is neither the client port %d nor the cluster port %d", p.ContainerPort, p.Name, o.Port, o.Cluster.Port)
		}
	}
	return errs
}

// redact hides a URL's password.
func redact(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User(c.User.Username())
	}
	return c.String()
}

// ProbeAnonymous starts the server of s on loopback (random ports, no
// routes, JetStream under tmp) and connects to its client and cluster
// ports with no credentials: both must refuse. It returns why either did
// not.
func ProbeAnonymous(s NATSServer, tmp string) error {
	o := s.Opts.Clone()
	o.Host, o.Port = "127.0.0.1", -1
	o.ServerName = "probe"
	o.StoreDir = filepath.Join(tmp, "jetstream")
	o.NoLog, o.NoSigs = true, true
	o.PidFile, o.PortsFileDir = "", ""
	clustered := o.Cluster.Port != 0
	if clustered {
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", -1
		o.Routes = nil
	}
	// A lone server of a JetStream cluster waits for its peers before it
	// serves clients; the probe needs only the listeners and their auth.
	o.JetStream = false
	ns, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(30 * time.Second) {
		return errors.New("the server did not start listening within 30 s")
	}
	if err := refusesAnonymous(ns.Addr().String(), `{"verbose":false,"pedantic":false,"protocol":1}`); err != nil {
		return fmt.Errorf("client port: %w", err)
	}
	if clustered {
		addr := ns.ClusterAddr()
		if addr == nil {
			return errors.New("no cluster listener")
		}
		if err := refusesAnonymous(addr.String(), `{"verbose":false,"pedantic":false,"name":"probe-route"}`); err != nil {
			return fmt.Errorf("cluster port: %w", err)
		}
	}
	return nil
}

// refusesAnonymous speaks the NATS protocol to addr: the INFO must say
// auth_required, and a CONNECT without credentials must get an error.
func refusesAnonymous(addr, connect string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("read INFO: %w", err)
	}
	info, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok {
		return fmt.Errorf("first line %q is not INFO", line)
	}
	var fields struct {
		AuthRequired bool `json:"auth_required"`
	}
	if err := json.Unmarshal([]byte(info), &fields); err != nil {
		return fmt.Errorf("INFO: %w", err)
	}
	if !fields.AuthRequired {
		return errors.New("INFO says auth_required false")
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s\r\nPING\r\n", connect); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			// Closed without an answer to PING: refused.
			return nil
		}
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "-ERR"):
			return nil
		case t == "PONG":
			return errors.New("a CONNECT without credentials was answered PONG: the port admits anonymous connections")
		}
	}
}

// NATSPort is a port of a workload that speaks the NATS protocol.
type NATSPort struct {
	Workload Workload
	Port     int32
	What     string
}

// CheckCoordinators checks the install's coordinator containers: none
// passes --insecure-nats; one with --nats-url has --nats-creds and dials a
// Service of the install that selects NATS servers checked here; one
// without runs the embedded server (which admits no anonymous client: the
// coordinator package's tests show it) on --nats-listen's port, returned
// so that its NetworkPolicy coverage is checked too.
func CheckCoordinators(in *Install, servers []NATSServer) ([]NATSPort, []error) {
	var ports []NATSPort
	var errs []error
	for _, w := range in.Workloads() {
		for _, c := range w.Template.Spec.Containers {
			if !isCoordinator(c) {
				continue
			}
			bad := func(format string, args ...any) {
				errs = append(errs, fmt.Errorf("%s: container %q: %s", w.Where(), c.Name, fmt.Sprintf(format, args...)))
			}
			args := append(append([]string(nil), c.Command...), c.Args...)
			if _, ok := flagValue(args, "--insecure-nats"); ok || containsArg(args, "--insecure-nats") {
				bad("--insecure-nats: the coordinator would start against a NATS that admits anonymous clients")
			}
			u, external := flagValue(args, "--nats-url")
			if !external {
				listen, ok := flagValue(args, "--nats-listen")
				if !ok {
					bad("embedded NATS without --nats-listen: say which port it serves")
					continue
				}
				_, p, err := net.SplitHostPort(listen)
				n, err2 := strconv.Atoi(p)
				if err != nil || err2 != nil {
					bad("--nats-listen %q is not host:port", listen)
					continue
				}
				ports = append(ports, NATSPort{w, int32(n), "embedded NATS client port"})
				continue
			}
			if _, ok := flagValue(args, "--nats-creds"); !ok {
				bad("--nats-url without --nats-creds")
			}
			pu, err := url.Parse(u)
			if err != nil || pu.Hostname() == "" {
				bad("--nats-url %q is not a URL", u)
				continue
			}
			svcName, _, _ := strings.Cut(pu.Hostname(), ".")
			svc, ok := in.Find("Service", svcName)
			if !ok {
				bad("--nats-url %s: no Service %s in the install", u, svcName)
				continue
			}
			sel := labels.SelectorFromSet(svc.Value.(*corev1.Service).Spec.Selector)
			served := false
			for _, s := range servers {
				if sel.Matches(labels.Set(s.Workload.Template.Labels)) {
					served = true
				}
			}
			if !served {
				bad("--nats-url %s: Service %s selects no nats-server checked here", u, svcName)
			}
		}
	}
	return ports, errs
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a || strings.HasPrefix(x, a+"=") {
			return true
		}
	}
	return false
}

// ServerPorts returns the NATS ports of the servers: client and cluster.
func ServerPorts(servers []NATSServer) []NATSPort {
	var ports []NATSPort
	for _, s := range servers {
		ports = append(ports, NATSPort{s.Workload, int32(s.Opts.Port), "NATS client port"})
		if s.Opts.Cluster.Port != 0 {
			ports = append(ports, NATSPort{s.Workload, int32(s.Opts.Cluster.Port), "NATS cluster port"})
		}
	}
	return ports
}

// CheckNATSExposure checks that every NATS port is fenced: at least one
// NetworkPolicy of the install selects its pods for Ingress, and every
// ingress rule of those policies that admits the port names its peers by
// pod labels (no rule without `from`, no ipBlock, no peer that is only a
// namespace selector); and no Service exposes it outside the cluster
// (NodePort, LoadBalancer, externalIPs).
func CheckNATSExposure(in *Install, ports []NATSPort) []error {
	var errs []error
	for _, np := range ports {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s %d: %s", np.Workload.Where(), np.What, np.Port, fmt.Sprintf(format, args...)))
		}
		podLabels := labels.Set(np.Workload.Template.Labels)
		covered := false
		for _, o := range in.Objects {
			pol, ok := o.Value.(*networkingv1.NetworkPolicy)
			if !ok {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
			if err != nil || !sel.Matches(podLabels) || !hasIngressType(pol) {
				continue
			}
			covered = true
			for i, rule := range pol.Spec.Ingress {
				if !ruleAdmitsPort(rule, np, podLabels) {
					continue
				}
				if len(rule.From) == 0 {
					bad("%s ingress[%d] admits it from anywhere", o.Where(), i)
				}
				for j, peer := range rule.From {
					if peer.IPBlock != nil {
						bad("%s ingress[%d].from[%d] admits an ipBlock", o.Where(), i, j)
					}
					if peer.PodSelector == nil || (len(peer.PodSelector.MatchLabels) == 0 && len(peer.PodSelector.MatchExpressions) == 0) {
						bad("%s ingress[%d].from[%d] admits every pod of the namespaces it selects", o.Where(), i, j)
					}
				}
			}
		}
		if !covered {
			bad("no NetworkPolicy of the install selects its pods for Ingress")
		}
		for _, o := range in.Objects {
			svc, ok := o.Value.(*corev1.Service)
			if !ok || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
				continue
			}
			for _, p := range svc.Spec.Ports {
				if cp, ok := containerPort(&np.Workload.Template.Spec, p.TargetPort); !ok || cp != np.Port {
					continue
				}
				if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0 {
					bad("%s exposes it outside the cluster (%s)", o.Where(), svc.Spec.Type)
				}
			}
		}
	}
	return errs
}

func hasIngressType(p *networkingv1.NetworkPolicy) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return true // Ingress is implied
	}
	for _, t := range p.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeIngress {
			return true
		}
	}
	return false
}

// ruleAdmitsPort reports whether rule applies to np's port (no ports means
// every port; a named port is resolved against the pod's containers).
func ruleAdmitsPort(rule networkingv1.NetworkPolicyIngressRule, np NATSPort, _ labels.Set) bool {
	if len(rule.Ports) == 0 {
		return true
	}
	for _, p := range rule.Ports {
		if p.Port == nil {
			return true
		}
		if cp, ok := containerPort(&np.Workload.Template.Spec, *p.Port); ok && cp == np.Port {
			return true
		}
		if p.EndPort != nil && p.Port.IntVal <= np.Port && np.Port <= *p.EndPort {
			return true
		}
	}
	return false
}
