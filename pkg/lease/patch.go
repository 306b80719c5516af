package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Patch is a JSON patch (RFC 6902) of a Lease. Its test operations come
// first: the apiserver applies the patch to the Lease as stored, inside the
// same compare-and-swap on etcd with which it writes the result, so a patch
// whose tests pass there is a compare-and-swap on exactly the fields it
// tests. Writes of a lock's grant test its holder and token, not the
// whole object: waiters registering in the queue (other fields of the same
// Lease) never make a holder's write fail.
type Patch struct {
	ops []patchOp
}

type patchOp struct {
	Op    string           `json:"op"`
	Path  string           `json:"path"`
	Value *json.RawMessage `json:"value,omitempty"`
}

// pointer escapes a key for a JSON pointer (RFC 6901).
func pointer(key string) string {
	return strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// AnnotationPath is the JSON pointer of an annotation.
func AnnotationPath(key string) string { return "/metadata/annotations/" + pointer(key) }

// LabelPath is the JSON pointer of a label.
func LabelPath(key string) string { return "/metadata/labels/" + pointer(key) }

func (p *Patch) op(op, path string, value any) {
	o := patchOp{Op: op, Path: path}
	if op != "remove" {
		raw, err := json.Marshal(value)
		if err != nil {
			// Only strings, numbers, times and nil are passed in.
			panic(fmt.Sprintf("lease patch: encoding %v: %v", value, err))
		}
		msg := json.RawMessage(raw)
		o.Value = &msg
	}
	p.ops = append(p.ops, o)
}

// Test makes the patch apply only while path holds value (nil: while it is
// absent).
func (p *Patch) Test(path string, value any) { p.op("test", path, value) }

// Set sets path (an object member) to value, adding it if absent.
func (p *Patch) Set(path string, value any) { p.op("add", path, value) }

// Remove removes path, which must be present.
func (p *Patch) Remove(path string) { p.op("remove", path, nil) }

// Append adds other's operations after p's.
func (p *Patch) Append(other *Patch) { p.ops = append(p.ops, other.ops...) }

// RemoveAnnotationIf removes an annotation that the copy l shows.
func (p *Patch) RemoveAnnotationIf(l map[string]string, key string) {
	if _, ok := l[key]; ok {
		p.Remove(AnnotationPath(key))
	}
}

// Bytes is the patch as the apiserver takes it (types.JSONPatchType).
func (p *Patch) Bytes() []byte {
	raw, err := json.Marshal(p.ops)
	if err != nil {
		panic(fmt.Sprintf("lease patch: %v", err))
	}
	return raw
}

// String is the patch, for logs and test failures.
func (p *Patch) String() string { return string(p.Bytes()) }

// PatchDidNotApply reports whether a Patch failed because the Lease was not
// what it tested (or something it removed was gone): the apiserver answers
// such a patch 422 with no details, while a result it finds invalid comes
// back 422 with the object's name and the causes.
func PatchDidNotApply(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	st := status.Status()
	return st.Code == http.StatusUnprocessableEntity && st.Reason == metav1.StatusReasonInvalid &&
		(st.Details == nil || st.Details.Name == "" && len(st.Details.Causes) == 0)
}

// ApplyTo is current with the patch applied, as the apiserver would apply
// it (the same implementation), keeping current's resourceVersion: written
// with an Update, it is the exact form of the patch, a compare-and-swap on
// the whole object that lands only if nothing at all wrote the Lease since
// current, and travels in the apiserver's cheapest encoding. The patch's
// tests must hold on current.
func (p *Patch) ApplyTo(current *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	raw, err := json.Marshal(current)
	if err != nil {
		return nil, fmt.Errorf("encoding lease %s: %w", current.Name, err)
	}
	decoded, err := jsonpatch.DecodePatch(p.Bytes())
	if err != nil {
		return nil, fmt.Errorf("decoding a patch of lease %s: %w", current.Name, err)
	}
	patched, err := decoded.Apply(raw)
	if err != nil {
		return nil, fmt.Errorf("applying a patch to lease %s: %w", current.Name, err)
	}
	out := &coordinationv1.Lease{}
	if err := json.Unmarshal(patched, out); err != nil {
		return nil, fmt.Errorf("decoding patched lease %s: %w", current.Name, err)
	}
	return out, nil
}
