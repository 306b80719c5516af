// Package manifests creates the objects of YAML manifest files, for the
// quick start and the tests that apply shipped samples and policies.
package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
)

// CreateShippedPolicy creates the admission policies and their bindings
// that config/<name> ships (policy.yaml, mutating.yaml when there is one,
// then binding.yaml). The apiserver enforces a new policy only some moments
// later: callers wait for that.
func CreateShippedPolicy(ctx context.Context, c client.Client, name string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "config", name)
	files := []string{filepath.Join(dir, "policy.yaml")}
	if _, err := os.Stat(filepath.Join(dir, "mutating.yaml")); err == nil {
		files = append(files, filepath.Join(dir, "mutating.yaml"))
	}
	if _, err := CreateFromFiles(ctx, c, "", append(files, filepath.Join(dir, "binding.yaml"))...); err != nil {
		return fmt.Errorf("installing config/%s: %w", name, err)
	}
	return nil
}

// CreateFromFiles creates every object in the YAML files, in order, and
// returns them. Namespaced objects that name no namespace go into namespace
// when it is not empty.
func CreateFromFiles(ctx context.Context, c client.Client, namespace string, paths ...string) ([]*unstructured.Unstructured, error) {
	var created []*unstructured.Unstructured
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return created, fmt.Errorf("reading manifest: %w", err)
		}
		objs, err := Decode(data)
		if err != nil {
			return created, fmt.Errorf("decoding %s: %w", path, err)
		}
		for _, obj := range objs {
			if err := setNamespace(c, obj, namespace); err != nil {
				return created, err
			}
			if err := c.Create(ctx, obj); err != nil {
				return created, fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), path, err)
			}
			created = append(created, obj)
		}
	}
	return created, nil
}

// Decode returns the objects of a YAML (or JSON) stream, skipping empty
// documents.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return objs, err
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// setNamespace puts a namespaced object that names no namespace into
// namespace.
func setNamespace(c client.Client, obj *unstructured.Unstructured, namespace string) error {
	if namespace == "" || obj.GetNamespace() != "" {
		return nil
	}
	namespaced, err := c.IsObjectNamespaced(obj)
	if err != nil {
		return fmt.Errorf("finding the scope of %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	if namespaced {
		obj.SetNamespace(namespace)
	}
	return nil
}
