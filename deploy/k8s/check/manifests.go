// Package check validates Tether's Kubernetes manifests (deploy/k8s)
// offline, with no cluster and no downloaded schemas: every document is
// decoded strictly into its k8s.io/api type (an unknown or misspelt field, a
// wrong type or a duplicate key is an error), every kustomization's
// resources exist, and references inside each install (selectors, named
// ports, volumes, ConfigMaps and Services) resolve. On top of that it
// asserts the NATS property of issue 13: no NATS port of any install is
// reachable without credentials (see nats.go).
//
// It is its own module (deploy/k8s/check/go.mod) so that the Kubernetes
// API types and nats-server's configuration parser stay out of Tether's
// go.mod; `make k8s-check` runs it. The tests read the manifests from
// $TETHER_K8S_DIR (default: the parent directory) and the NATS layout
// include from $TETHER_NATS_LAYOUT (the Makefile writes one with `tether
// nats server-config`).
package check

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest document.
type Object struct {
	// File is the path it was read from, relative to the manifest root;
	// Index is its position among the file's documents (0-based).
	File  string
	Index int
	// Kind and Name are the document's kind and metadata.name.
	Kind, Name string
	// Value is the typed object (*appsv1.Deployment, *corev1.Service, ...).
	Value any
}

// Where names the document in errors: FILE#INDEX KIND/NAME.
func (o Object) Where() string {
	return fmt.Sprintf("%s#%d %s/%s", o.File, o.Index, o.Kind, o.Name)
}

// Kustomization is the part of a kustomize.config.k8s.io/v1beta1
// Kustomization these manifests use; any other field is an error, so a
// field this check does not understand cannot slip by.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// newTyped returns a pointer to the zero value of the API type of
// apiVersion and kind, or an error for a kind these manifests do not use
// (add it here when they start to).
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		return &Kustomization{}, nil
	}
	return nil, fmt.Errorf("apiVersion %q kind %q is not a type this check knows", apiVersion, kind)
}

// docSep splits a YAML stream into documents.
var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// DecodeStrict decodes one YAML document into its typed object. Duplicate
// keys, unknown fields, wrong types and trailing data are errors. A
// document of only comments returns (nil, nil).
func DecodeStrict(doc []byte) (any, error) {
	if len(bytes.TrimSpace(stripComments(doc))) == 0 {
		return nil, nil
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, fmt.Errorf("apiVersion/kind: %w", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, errors.New("no apiVersion or kind")
	}
	v, err := newTyped(tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s %s: data after the object", tm.APIVersion, tm.Kind)
	}
	return v, nil
}

// stripComments drops whole-line comments (to tell an empty document).
func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// LoadFile decodes every document of the YAML file root/rel.
func LoadFile(root, rel string) ([]Object, error) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	var objs []Object
	for i, doc := range docSep.Split(string(b), -1) {
		v, err := DecodeStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", rel, i, err)
		}
		if v == nil {
			continue
		}
		o := Object{File: rel, Index: i, Value: v}
		o.Kind, o.Name = kindName(v)
		if o.Name == "" && o.Kind != "Kustomization" {
			return nil, fmt.Errorf("%s: no metadata.name", o.Where())
		}
		objs = append(objs, o)
	}
	return objs, nil
}

// kindName returns v's kind and name. Every object type decoded here is
// named after its kind (corev1.ConfigMap is kind ConfigMap), so the type
// gives the kind and metav1.Object the name.
func kindName(v any) (string, string) {
	if k, ok := v.(*Kustomization); ok {
		return k.Kind, ""
	}
	if o, ok := v.(metav1.Object); ok {
		return reflect.TypeOf(v).Elem().Name(), o.GetName()
	}
	return fmt.Sprintf("%T", v), ""
}

// Install is what one kustomization applies: its objects, with those of the
// kustomizations it includes, and the files they came from.
type Install struct {
	// Dir is the kustomization's directory, relative to the manifest root.
	Dir     string
	Objects []Object
	Files   []string
}

// LoadInstall resolves the kustomization in root/dir recursively: every
// resource must be a YAML file or a directory with its own
// kustomization.yaml, and none may be listed twice.
func LoadInstall(root, dir string) (*Install, error) {
	in := &Install{Dir: dir}
	seen := map[string]bool{}
	if err := in.add(root, dir, seen, nil); err != nil {
		return nil, err
	}
	sort.Strings(in.Files)
	return in, nil
}

func (in *Install) add(root, dir string, seen map[string]bool, stack []string) error {
	if slices.Contains(stack, dir) {
		return fmt.Errorf("kustomization cycle: %s -> %s", strings.Join(stack, " -> "), dir)
	}
	kfile := filepath.Join(dir, "kustomization.yaml")
	objs, err := LoadFile(root, kfile)
	if err != nil {
		return err
	}
	if len(objs) != 1 {
		return fmt.Errorf("%s: %d documents, want one Kustomization", kfile, len(objs))
	}
	k, ok := objs[0].Value.(*Kustomization)
	if !ok {
		return fmt.Errorf("%s: a %s, not a Kustomization", kfile, objs[0].Kind)
	}
	if len(k.Resources) == 0 {
		return fmt.Errorf("%s: no resources", kfile)
	}
	in.Files = append(in.Files, kfile)
	for _, r := range k.Resources {
		rel := filepath.Clean(filepath.Join(dir, r))
		if strings.HasPrefix(rel, "..") {
			return fmt.Errorf("%s: resource %q is outside the manifest root", kfile, r)
		}
		fi, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			return fmt.Errorf("%s: resource %q: %w", kfile, r, err)
		}
		if seen[rel] {
			return fmt.Errorf("%s: resource %q is included twice", kfile, r)
		}
		seen[rel] = true
		if fi.IsDir() {
			if err := in.add(root, rel, seen, append(stack, dir)); err != nil {
				return err
			}
			continue
		}
		objs, err := LoadFile(root, rel)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if _, ok := o.Value.(*Kustomization); ok {
				return fmt.Errorf("%s: resource %q is a Kustomization: list its directory", kfile, r)
			}
		}
		in.Objects = append(in.Objects, objs...)
		in.Files = append(in.Files, rel)
	}
	return nil
}

// Workload is a pod template with the object that owns it.
type Workload struct {
	Object
	Template *corev1.PodTemplateSpec
	Selector *metav1.LabelSelector
}

// Workloads returns the install's Deployments, StatefulSets and DaemonSets.
func (in *Install) Workloads() []Workload {
	var ws []Workload
	for _, o := range in.Objects {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			ws = append(ws, Workload{o, &v.Spec.Template, v.Spec.Selector})
		case *appsv1.StatefulSet:
			ws = append(ws, Workload{o, &v.Spec.Template, v.Spec.Selector})
		case *appsv1.DaemonSet:
			ws = append(ws, Workload{o, &v.Spec.Template, v.Spec.Selector})
		}
	}
	return ws
}

// Find returns the install's object of kind and name.
func (in *Install) Find(kind, name string) (Object, bool) {
	for _, o := range in.Objects {
		if o.Kind == kind && o.Name == name {
			return o, true
		}
	}
	return Object{}, false
}
