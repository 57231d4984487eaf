package check

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Namespace is the namespace every namespaced object of the manifests is in.
const Namespace = "tether"

// CheckReferences returns every broken reference inside the install: a
// namespaced object outside Namespace, a workload whose selector does not
// select its own template, a volume mount of an undeclared volume, a probe
// or Service targetPort naming no container port, a Service, PDB or
// NetworkPolicy selecting no pod of the install, a StatefulSet whose
// serviceName is not a headless Service, a duplicate object.
func CheckReferences(in *Install) []error {
	var errs []error
	bad := func(o Object, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", o.Where(), fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{}
	for _, o := range in.Objects {
		key := o.Kind + "/" + o.Name
		if seen[key] {
			bad(o, "defined twice in the install %s", in.Dir)
		}
		seen[key] = true
		if o.Kind == "Namespace" {
			continue
		}
		if ns := namespaceOf(o.Value); ns != Namespace {
			bad(o, "namespace %q, want %q", ns, Namespace)
		}
	}
	ws := in.Workloads()
	for _, w := range ws {
		sel, err := metav1.LabelSelectorAsSelector(w.Selector)
		if err != nil || w.Selector == nil || sel.Empty() {
			bad(w.Object, "selector %v is empty or invalid (%v)", w.Selector, err)
			continue
		}
		if !sel.Matches(labels.Set(w.Template.Labels)) {
			bad(w.Object, "selector %s does not select its pod template's labels %v", sel, w.Template.Labels)
		}
		errs = append(errs, checkPodSpec(w.Object, &w.Template.Spec)...)
	}
	for _, o := range in.Objects {
		switch v := o.Value.(type) {
		case *corev1.Service:
			if len(v.Spec.Selector) == 0 {
				bad(o, "no selector")
				continue
			}
			matched := podsMatching(ws, labels.SelectorFromSet(v.Spec.Selector))
			if len(matched) == 0 {
				bad(o, "selector %v selects no pod of the install", v.Spec.Selector)
			}
			for _, p := range v.Spec.Ports {
				for _, w := range matched {
					if _, ok := containerPort(&w.Template.Spec, p.TargetPort); !ok {
						bad(o, "port %q: targetPort %s is no container port of %s", p.Name, p.TargetPort.String(), w.Where())
					}
				}
			}
		case *appsv1.StatefulSet:
			svc, ok := in.Find("Service", v.Spec.ServiceName)
			if !ok {
				bad(o, "serviceName %q is no Service of the install", v.Spec.ServiceName)
			} else if s := svc.Value.(*corev1.Service); s.Spec.ClusterIP != corev1.ClusterIPNone {
				bad(o, "serviceName %q is not a headless Service (clusterIP: None)", v.Spec.ServiceName)
			}
		case *policyv1.PodDisruptionBudget:
			if sel, err := metav1.LabelSelectorAsSelector(v.Spec.Selector); err != nil || sel.Empty() || len(podsMatching(ws, sel)) == 0 {
				bad(o, "selector %v selects no pod of the install (%v)", v.Spec.Selector, err)
			}
		case *networkingv1.NetworkPolicy:
			sel, err := metav1.LabelSelectorAsSelector(&v.Spec.PodSelector)
			if err != nil || len(podsMatching(ws, sel)) == 0 {
				bad(o, "podSelector %v selects no pod of the install (%v)", v.Spec.PodSelector, err)
			}
		}
	}
	return errs
}

// checkPodSpec checks a pod template's internal references.
func checkPodSpec(o Object, spec *corev1.PodSpec) []error {
	var errs []error
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		if vols[v.Name] {
			errs = append(errs, fmt.Errorf("%s: volume %q declared twice", o.Where(), v.Name))
		}
		vols[v.Name] = true
	}
	claims := map[string]bool{}
	if ss, ok := o.Value.(*appsv1.StatefulSet); ok {
		for _, c := range ss.Spec.VolumeClaimTemplates {
			claims[c.Name] = true
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if c.Image == "" {
			errs = append(errs, fmt.Errorf("%s: container %q has no image", o.Where(), c.Name))
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] && !claims[m.Name] {
				errs = append(errs, fmt.Errorf("%s: container %q mounts undeclared volume %q", o.Where(), c.Name, m.Name))
			}
		}
		for what, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
			if p == nil {
				continue
			}
			var port *intstr.IntOrString
			switch {
			case p.HTTPGet != nil:
				port = &p.HTTPGet.Port
			case p.TCPSocket != nil:
				port = &p.TCPSocket.Port
			}
			if port != nil && port.Type == intstr.String {
				if _, ok := containerPort(&corev1.PodSpec{Containers: []corev1.Container{c}}, *port); !ok {
					errs = append(errs, fmt.Errorf("%s: container %q %s port %q is no port of it", o.Where(), c.Name, what, port.StrVal))
				}
			}
		}
	}
	return errs
}

// containerPort resolves a Service or probe port against spec's containers.
func containerPort(spec *corev1.PodSpec, p intstr.IntOrString) (int32, bool) {
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// podsMatching returns the workloads whose pod template sel selects.
func podsMatching(ws []Workload, sel labels.Selector) []Workload {
	var out []Workload
	for _, w := range ws {
		if sel.Matches(labels.Set(w.Template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// namespaceOf returns a namespaced object's metadata.namespace.
func namespaceOf(v any) string {
	if m, ok := v.(interface{ GetNamespace() string }); ok {
		return m.GetNamespace()
	}
	return ""
}
