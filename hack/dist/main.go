// Command dist writes what dist/ ships from config/: the install bundles
// (config/default as kustomize renders it, in one file, with the manager's
// image set; config/mutating's optional MutatingAdmissionPolicies in a file
// of their own) and the Helm chart (every object of config/default, and
// config/mutating's and config/prometheus's each behind a value and the
// cluster's capabilities, with the values a user sets templated in, so
// that the chart's default rendering is the bundles the cluster can take).
// With -check it compares a rendering of the chart (helm template) with the
// bundles, object by object, and with -served also checks that the
// rendering holds no object of a kind the cluster does not serve.
//
// It is a Go module of its own (hack/dist/go.mod), built into
// bin/frontdesk-dist by make dist-generator, and run from the repository's
// root (it reads config/ and writes dist/ relative to it):
//
//	bin/frontdesk-dist -bundle dist/install.yaml -mutating-bundle dist/install-mutating.yaml -image frontdesk-controller:latest
//	bin/frontdesk-dist -chart dist/chart -image frontdesk-controller:latest
//	bin/frontdesk-dist -check rendered.yaml -against dist/install.yaml,dist/install-mutating.yaml
//	bin/frontdesk-dist -check rendered.yaml -against dist/install.yaml -served v1/Namespace,apps/v1/Deployment,...
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func main() {
	bundle := flag.String("bundle", "", "Write the install bundle (config/default) to this file.")
	mutating := flag.String("mutating-bundle", "", "With -bundle: write config/mutating's bundle to this file.")
	chart := flag.String("chart", "", "Write the chart into this directory (replaced).")
	image := flag.String("image", "frontdesk-controller:latest", "The manager's image (repository:tag): the bundle's, and the chart's default.")
	check := flag.String("check", "", "Compare this rendering of the chart with -against.")
	against := flag.String("against", "dist/install.yaml", "The bundles -check compares with, comma-separated: the rendering must hold their objects and no others.")
	served := flag.String("served", "", "With -check: the kinds the cluster serves, as group/version/Kind, comma-separated; the rendering may hold no object of another kind.")
	flag.Parse()
	var err error
	switch {
	case *check != "":
		err = compare(*check, strings.Split(*against, ","), *served)
	case *bundle != "":
		err = writeBundles(*bundle, *mutating, *image)
	case *chart != "":
		err = writeChart(*chart, *image)
	default:
		err = errors.New("give -bundle, -chart or -check")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		os.Exit(1)
	}
}

// managerImage is the image config/manager names, which the bundle and the
// chart replace.
const managerImage = "image: controller:latest"

// bundleHeader is the head of dist/install.yaml.
const bundleHeader = `# frontdesk install bundle: config/default rendered by make build-installer; do not edit.
# Kubernetes 1.33 and later: kubectl apply --server-side -f install.yaml
# Where the cluster serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
# (Kubernetes 1.36 and later), apply install-mutating.yaml after it: the admission
# gate and the principal of stock client-go electors' grants. Without it, a pod
# that runs holding a lock carries the scheduling gate in its template
# (docs/annotations.md). Upgrade: apply the new release's bundles the same way.
# kubectl delete -f install.yaml deletes the CRD, and every lock with it: delete
# the locks first, while the manager runs (README, "Install, upgrade, uninstall").
`

// mutatingHeader is the head of dist/install-mutating.yaml.
const mutatingHeader = `# frontdesk's optional MutatingAdmissionPolicies: config/mutating rendered by make
# build-installer; do not edit. Only for clusters that serve
# admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36 and
# later); apply it after install.yaml:
#   kubectl apply --server-side -f install-mutating.yaml
# Nothing install.yaml enforces depends on it.
`

// writeBundles renders config/default into one file, with the manager's
// image set, and config/mutating into another when mutatingPath is set.
func writeBundles(path, mutatingPath, image string) error {
	objs, err := render("config/default")
	if err != nil {
		return err
	}
	replaced := false
	for i, o := range objs {
		if o.kind == "Deployment" && strings.Contains(string(o.yaml), managerImage) {
			objs[i].yaml, replaced = []byte(strings.ReplaceAll(string(o.yaml), managerImage, "image: "+image)), true
		}
	}
	if !replaced {
		return fmt.Errorf("config/default has no Deployment with %q", managerImage)
	}
	if err := writeBundle(path, bundleHeader, objs); err != nil {
		return err
	}
	if mutatingPath == "" {
		return nil
	}
	mutating, err := render("config/mutating")
	if err != nil {
		return err
	}
	return writeBundle(mutatingPath, mutatingHeader, mutating)
}

// writeBundle writes objs into one file, after header.
func writeBundle(path, header string, objs []object) error {
	var b strings.Builder
	b.WriteString(header)
	for i, o := range objs {
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(o.yaml)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// mutatingCondition renders config/mutating's policies only where the
// cluster serves MutatingAdmissionPolicy v1, unless a value turns them off.
const mutatingCondition = `and .Values.mutatingPolicies.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")`

// writeChart renders config/default, config/mutating and config/prometheus
// and writes the chart.
func writeChart(out, image string) error {
	repo, tag, ok := strings.Cut(image, ":")
	if !ok {
		return fmt.Errorf("-image %q: want repository:tag", image)
	}
	objs, err := render("config/default")
	if err != nil {
		return err
	}
	mutating, err := render("config/mutating")
	if err != nil {
		return err
	}
	monitoring, err := render("config/prometheus")
	if err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(out, "templates"), 0o755); err != nil {
		return err
	}
	writeTemplate := func(o object, text string) error {
		name := strings.ToLower(o.kind + "-" + o.name + ".yaml")
		return os.WriteFile(filepath.Join(out, "templates", name), []byte(text), 0o644)
	}
	var resources any
	for _, o := range append(objs, monitoring...) {
		text := escape(string(o.yaml))
		switch {
		case o.kind == "Deployment":
			if text, resources, err = templateDeployment(text, o.yaml); err != nil {
				return err
			}
		case o.kind == "CustomResourceDefinition":
			if text, err = templateCRD(text); err != nil {
				return err
			}
		case strings.HasPrefix(o.apiVersion, "admissionregistration.k8s.io/"):
			text = wrap(".Values.policies.enabled", text)
		case strings.HasPrefix(o.apiVersion, "flowcontrol.apiserver.k8s.io/"):
			text = wrap(".Values.priority.enabled", text)
		case o.kind == "ServiceMonitor":
			text = wrap(`and .Values.metrics.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")`, text)
		case o.kind == "PrometheusRule":
			text = wrap(`and .Values.alerts.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule")`, text)
		}
		if err := writeTemplate(o, text); err != nil {
			return err
		}
	}
	for _, o := range mutating {
		if err := writeTemplate(o, wrap(mutatingCondition, escape(string(o.yaml)))); err != nil {
			return err
		}
	}
	if resources == nil {
		return errors.New("config/default has no Deployment")
	}
	res, err := yaml.Marshal(map[string]any{"resources": resources})
	if err != nil {
		return err
	}
	files := map[string]string{
		"Chart.yaml":  chartYAML,
		"values.yaml": fmt.Sprintf(valuesYAML, repo, tag, strings.TrimSpace(string(res))),
		".helmignore": "# Generated by hack/dist (make chart).\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(out, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

const chartYAML = `# Generated by hack/dist from config/ (make chart); do not edit.
apiVersion: v2
name: frontdesk
description: Distributed locks with fencing tokens for Kubernetes.
type: application
version: 0.1.0
appVersion: "0.1.0"
`

const valuesYAML = `# Generated by hack/dist from config/ (make chart); do not edit. The
# defaults render config/default's objects, the install bundle's
# (dist/install.yaml), and config/mutating's (dist/install-mutating.yaml)
# where the cluster serves MutatingAdmissionPolicy: make verify checks both.

# The manager's image.
image:
  repository: %s
  tag: %s
  # pullPolicy: empty leaves the cluster's default.
  pullPolicy: ""

# Manager replicas; with leader election one of them reconciles.
replicas: 2

# The manager container's requests and limits.
%s

leaderElection:
  # --leader-elect: keep it on with more than one replica.
  enabled: true

# --zap-log-level: debug, info, error, or a number for more detail; empty
# leaves the manager's default (info).
logLevel: ""

metrics:
  serviceMonitor:
    # A ServiceMonitor for the metrics Service, where the
    # monitoring.coreos.com/v1 ServiceMonitor CRD exists.
    enabled: true

alerts:
  # config/prometheus's PrometheusRule, where its CRD exists.
  enabled: true

crds:
  # Keep the DistributedLock CRD, and with it every lock, when the release is
  # uninstalled (helm.sh/resource-policy: keep); a reinstall of the release
  # (same name and namespace) takes it up again, and the locks' Leases carry
  # their fencing tokens on. false: helm uninstall deletes the CRD and every
  # lock; delete the locks first, while the manager runs (README, "Install,
  # upgrade, uninstall").
  keep: true

policies:
  # The Lease guard (config/lease-policy): ValidatingAdmissionPolicies that
  # keep participants from harming each other's grants.
  enabled: true

mutatingPolicies:
  # config/mutating's MutatingAdmissionPolicies: the admission gate and the
  # principal of stock client-go electors' grants. Rendered only where the
  # cluster serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
  # (Kubernetes 1.36 and later; helm reads .Capabilities, so helm template
  # needs --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy);
  # false leaves them out everywhere. Without the admission gate, a pod that
  # runs holding a lock carries the scheduling gate in its template
  # (docs/annotations.md).
  enabled: true

priority:
  # API Priority and Fairness for Lease writes (config/priority).
  enabled: true
`

// object is one rendered object.
type object struct {
	apiVersion, kind, name string
	yaml                   []byte
}

// render runs kustomize on dir, as `kubectl kustomize` does.
func render(dir string) ([]object, error) {
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy // kubectl kustomize's order: namespaces and CRDs first
	k := krusty.MakeKustomizer(opts)
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	var objs []object
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		objs = append(objs, object{apiVersion: r.GetApiVersion(), kind: r.GetKind(), name: r.GetName(), yaml: b})
	}
	return objs, nil
}

// braces is a run of braces with "{{" or "}}" in it, whole: a brace next
// to an escaped pair would make a delimiter of its own ("{}}" in CEL).
var braces = regexp.MustCompile(`[{}]*(\{\{|\}\})[{}]*`)

// escape keeps helm from reading "{{" and "}}" in the objects (alert
// annotations are Go templates of their own, CEL has nested braces).
func escape(s string) string {
	return braces.ReplaceAllStringFunc(s, func(b string) string { return `{{ "` + b + `" }}` })
}

func wrap(cond, text string) string {
	return "{{- if " + cond + " }}\n" + text + "{{- end }}\n"
}

// keepAnnotation is helm's resource policy that leaves an object in place
// when the release is uninstalled, or when an upgrade no longer renders it.
const keepAnnotation = "helm.sh/resource-policy"

// templateCRD gives the CRD helm's keep policy, unless crds.keep is false.
func templateCRD(text string) (string, error) {
	re := regexp.MustCompile(`(?m)^  annotations:\n`)
	loc := re.FindStringIndex(text)
	if loc == nil {
		return "", errors.New("the CRD has no metadata.annotations: update hack/dist")
	}
	return text[:loc[1]] + "    {{- if .Values.crds.keep }}\n    " + keepAnnotation + ": keep\n    {{- end }}\n" + text[loc[1]:], nil
}

// templateDeployment puts the values into the manager's Deployment and
// returns it with its resources, the default of .Values.resources.
func templateDeployment(text string, raw []byte) (string, any, error) {
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Resources any `json:"resources"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &d); err != nil || len(d.Spec.Template.Spec.Containers) != 1 {
		return "", nil, fmt.Errorf("the manager's Deployment: want one container (%v)", err) //nolint:errorlint // err is nil when the count is wrong; %w would print %!w(<nil>)
	}
	subs := []struct{ re, with string }{
		{`(?m)^  replicas: 2$`, `  replicas: {{ .Values.replicas }}`},
		{`(?m)^        ` + managerImage + `$`, `        image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
        {{- with .Values.image.pullPolicy }}
        imagePullPolicy: {{ . }}
        {{- end }}`},
		{`(?m)^        - --leader-elect$`, `        {{- if .Values.leaderElection.enabled }}
        - --leader-elect
        {{- end }}
        {{- with .Values.logLevel }}
        - --zap-log-level={{ . }}
        {{- end }}`},
		{`(?m)^        resources:\n(?:          .*\n)+`, "        resources:\n          {{- toYaml .Values.resources | nindent 10 }}\n"},
	}
	for _, s := range subs {
		re := regexp.MustCompile(s.re)
		if !re.MatchString(text) {
			return "", nil, fmt.Errorf("the manager's Deployment has no line matching %s: update hack/dist", s.re)
		}
		text = re.ReplaceAllLiteralString(text, s.with)
	}
	return text, d.Spec.Template.Spec.Containers[0].Resources, nil
}

// compare fails unless the rendering holds the objects of the bundles and
// no others, helm's keep policy aside (only helm reads it), and, when
// served is set, none of a kind outside that list.
func compare(renderedPath string, bundlePaths []string, served string) error {
	rendered, err := decodeFile(renderedPath)
	if err != nil {
		return err
	}
	bundle := map[string]*unstructured.Unstructured{}
	for _, path := range bundlePaths {
		objs, err := decodeFile(path)
		if err != nil {
			return err
		}
		for k, o := range objs {
			if _, dup := bundle[k]; dup {
				return fmt.Errorf("%s: %s is in another bundle too", path, k)
			}
			bundle[k] = o
		}
	}
	var diffs []string
	if served != "" {
		kinds := strings.Split(served, ",")
		for k, r := range rendered {
			if !slices.Contains(kinds, r.GetAPIVersion()+"/"+r.GetKind()) {
				diffs = append(diffs, k+": rendered by the chart, a kind the cluster does not serve")
			}
		}
	}
	for _, r := range rendered {
		dropKeepPolicy(r)
	}
	for k, o := range bundle {
		r, ok := rendered[k]
		switch {
		case !ok:
			diffs = append(diffs, k+": in the bundle, not rendered by the chart")
		case !reflect.DeepEqual(o.Object, r.Object):
			a, _ := yaml.Marshal(o.Object)
			b, _ := yaml.Marshal(r.Object)
			diffs = append(diffs, fmt.Sprintf("%s differs:\n--- bundle\n%s--- chart\n%s", k, a, b))
		}
	}
	for k := range rendered {
		if _, ok := bundle[k]; !ok {
			diffs = append(diffs, k+": rendered by the chart, not in the bundle")
		}
	}
	bundles := strings.Join(bundlePaths, " + ")
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return fmt.Errorf("the chart's rendering (%s) is not the bundle (%s):\n%s", renderedPath, bundles, strings.Join(diffs, "\n"))
	}
	fmt.Printf("%s: the chart renders the %d objects of %s", renderedPath, len(bundle), bundles)
	if served != "" {
		fmt.Printf(", each of a kind the cluster serves")
	}
	fmt.Println()
	return nil
}

// dropKeepPolicy removes helm's keep policy from o.
func dropKeepPolicy(o *unstructured.Unstructured) {
	a := o.GetAnnotations()
	if _, ok := a[keepAnnotation]; !ok {
		return
	}
	delete(a, keepAnnotation)
	if len(a) == 0 {
		a = nil
	}
	o.SetAnnotations(a)
}

func decodeFile(path string) (map[string]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if len(o.Object) == 0 {
			continue
		}
		k := o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		if _, dup := objs[k]; dup {
			return nil, fmt.Errorf("%s: %s twice", path, k)
		}
		objs[k] = o
	}
}
