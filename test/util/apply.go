package util

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreateFromFiles creates every object in the YAML files.
func CreateFromFiles(ctx context.Context, c client.Client, paths ...string) error {
	return CreateFromFilesIn(ctx, c, "", paths...)
}

// CreateFromFilesIn creates every object in the YAML files, putting
// namespaced objects that name no namespace into namespace (when not empty).
func CreateFromFilesIn(ctx context.Context, c client.Client, namespace string, paths ...string) error {
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err := dec.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("decoding %s: %w", path, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if namespace != "" && obj.GetNamespace() == "" {
				namespaced, err := c.IsObjectNamespaced(obj)
				if err != nil {
					return fmt.Errorf("finding the scope of %s %s: %w", obj.GetKind(), obj.GetName(), err)
				}
				if namespaced {
					obj.SetNamespace(namespace)
				}
			}
			if err := c.Create(ctx, obj); err != nil {
				return fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), path, err)
			}
		}
	}
	return nil
}
