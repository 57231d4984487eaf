package check

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// metricsFlags are the flag that serves /metrics for each Tether image:
// the coordinator's admin address, the agent's metrics address.
var metricsFlags = map[string]string{
	"tether/coordinator": "--http-addr",
	"tether/agent":       "--metrics-addr",
}

// CheckScrape returns what keeps Prometheus from scraping a Tether
// workload of the install: a coordinator or agent container without its
// metrics flag (metricsFlags) or with one naming no port, that port not
// declared as a container port, or a pod template without the
// prometheus.io/scrape, /port (the flag's port) and /path (/metrics)
// annotations the coordinators carry.
func CheckScrape(in *Install) []error {
	var errs []error
	for _, w := range in.Workloads() {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", w.Where(), fmt.Sprintf(format, args...)))
		}
		for _, c := range w.Template.Spec.Containers {
			flag := ""
			for image, f := range metricsFlags {
				if strings.Contains(c.Image, image) {
					flag = f
				}
			}
			if flag == "" {
				continue
			}
			port, ok := flagPort(c.Args, flag)
			if !ok {
				bad("container %s: no %s=HOST:PORT: Prometheus has nothing to scrape", c.Name, flag)
				continue
			}
			if !hasContainerPort(c, port) {
				bad("container %s: %s port %d is not among its ports", c.Name, flag, port)
			}
			a := w.Template.Annotations
			if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(port)) || a["prometheus.io/path"] != "/metrics" {
				bad("pod template annotations %v: want prometheus.io/scrape \"true\", prometheus.io/port %q, prometheus.io/path /metrics", a, strconv.Itoa(int(port)))
			}
		}
	}
	return errs
}

// flagPort is the port of the last --flag=HOST:PORT in args.
func flagPort(args []string, flag string) (int32, bool) {
	var port int32
	found := false
	for _, a := range args {
		v, ok := strings.CutPrefix(a, flag+"=")
		if !ok {
			continue
		}
		_, p, err := net.SplitHostPort(v)
		n, perr := strconv.ParseUint(p, 10, 16)
		if err != nil || perr != nil || n == 0 {
			return 0, false
		}
		port, found = int32(n), true
	}
	return port, found
}

func hasContainerPort(c corev1.Container, port int32) bool {
	for _, p := range c.Ports {
		if p.ContainerPort == port {
			return true
		}
	}
	return false
}
