package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// The kinds of write the adversary sends: any object, any theme.

// request is one write about one object, as a kind sends it. Kinds know
// nothing of Leases: pods that name a lock and fenced objects (issue 36)
// are sent by the same kinds.
type request struct {
	res  dynamic.ResourceInterface
	name string
	// before is the object as read; after, as the move would have it.
	before, after map[string]any
	// raw are JSON patch operations to send instead (values after could
	// not hold).
	raw []jsonOp
	// tests are the JSON patch tests a careful writer of the object sends
	// first (for a lock's Lease, its grant's token and holder).
	tests []jsonOp
}

// writeKind sends a request as one kind of write.
type writeKind interface {
	name() string
	// send sends req, and returns the request's body (for an update, the
	// JSON patch of what it changes) and the object as written.
	send(ctx context.Context, r *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error)
}

func writeKinds() map[string]writeKind {
	out := map[string]writeKind{}
	for _, k := range []writeKind{jsonPatchKind{}, mergePatchKind{types.MergePatchType}, mergePatchKind{types.StrategicMergePatchType},
		applyKind{}, updateKind{}, deleteKind{}, createKind{}} {
		out[k.name()] = k
	}
	return out
}

// resourceVersion is the metadata.resourceVersion of an object as JSON.
func resourceVersion(obj map[string]any) string {
	v, _, _ := unstructured.NestedString(obj, "metadata", "resourceVersion")
	return v
}

// createKind creates req.after (a new object: a pod, a fenced object).
type createKind struct{}

func (createKind) name() string { return "create" }

func (createKind) send(ctx context.Context, _ *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	body := mustJSON(req.after)
	written, err := req.res.Create(ctx, &unstructured.Unstructured{Object: req.after}, metav1.CreateOptions{})
	return body, written, err
}

type updateKind struct{}

func (updateKind) name() string { return "update" }

func (updateKind) send(ctx context.Context, r *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	after := (&unstructured.Unstructured{Object: req.after}).DeepCopy()
	blind := chance(r, 0.15)
	if blind {
		after.SetResourceVersion("") // an unconditional update: the copy as read, whatever landed since
	}
	diff := mustJSON(diffOps("", req.before, after.Object))
	body := []byte(fmt.Sprintf("update of resourceVersion %s (unconditional: %v), changing %s", resourceVersion(req.before), blind, diff))
	written, err := req.res.Update(ctx, after, metav1.UpdateOptions{})
	return body, written, err
}

type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	From  string `json:"from,omitempty"`
	Value any    `json:"value,omitempty"`
}

// MarshalJSON writes value for every op but remove, move and copy, also
// when it is null.
func (o jsonOp) MarshalJSON() ([]byte, error) {
	m := map[string]any{"op": o.Op, "path": o.Path}
	if o.From != "" {
		m["from"] = o.From
	}
	if o.Op != "remove" && o.Op != "move" && o.Op != "copy" {
		m["value"] = o.Value
	}
	return json.Marshal(m)
}

type jsonPatchKind struct{}

func (jsonPatchKind) name() string { return "json-patch" }

func (jsonPatchKind) send(ctx context.Context, r *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	ops := req.raw
	if ops == nil {
		ops = diffOps("", req.before, req.after)
		switch r.IntN(4) {
		case 0: // a compare-and-swap on the whole object, like an update
			ops = append([]jsonOp{{Op: "test", Path: "/metadata/resourceVersion", Value: resourceVersion(req.before)}}, ops...)
		case 1: // on what a careful writer tests
			ops = append(slices.Clone(req.tests), ops...)
		}
	}
	body := mustJSON(ops)
	written, err := req.res.Patch(ctx, req.name, types.JSONPatchType, body, metav1.PatchOptions{})
	return body, written, err
}

type mergePatchKind struct{ pt types.PatchType }

func (k mergePatchKind) name() string {
	if k.pt == types.StrategicMergePatchType {
		return "strategic-merge"
	}
	return "merge-patch"
}

func (k mergePatchKind) send(ctx context.Context, _ *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	body := mustJSON(mergeDiff(req.before, req.after))
	written, err := req.res.Patch(ctx, req.name, k.pt, body, metav1.PatchOptions{})
	return body, written, err
}

// applyKind sends what the move sets (not what it removes: server-side
// apply removes only fields its manager applied before) as a server-side
// apply, forced or not, under a field manager of its own or another's.
type applyKind struct{}

func (applyKind) name() string { return "apply" }

func (applyKind) send(ctx context.Context, r *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	diff, _ := mergeDiff(req.before, req.after).(map[string]any)
	config := dropNulls(diff).(map[string]any)
	config["apiVersion"], config["kind"] = req.before["apiVersion"], req.before["kind"]
	meta, _ := config["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["name"] = req.name
	config["metadata"] = meta
	body := mustJSON(config)
	written, err := req.res.Patch(ctx, req.name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: pick(r, "adversary", "frontdesk", "kube-controller-manager"), Force: new(chance(r, 0.5))})
	return body, written, err
}

type deleteKind struct{}

func (deleteKind) name() string { return "delete" }

func (deleteKind) send(ctx context.Context, r *rand.Rand, req request) ([]byte, *unstructured.Unstructured, error) {
	opts := metav1.DeleteOptions{}
	switch r.IntN(4) {
	case 0:
		opts.Preconditions = &metav1.Preconditions{ResourceVersion: new(resourceVersion(req.before))}
	case 1:
		opts.GracePeriodSeconds = new(int64(0))
	case 2:
		return []byte("deletecollection"), nil, req.res.DeleteCollection(ctx, opts, metav1.ListOptions{})
	}
	body := mustJSON(opts)
	return body, nil, req.res.Delete(ctx, req.name, opts)
}

// --- diffs of JSON objects ---

// mustJSON is v encoded; everything the adversary encodes can be.
func mustJSON(v any) []byte {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encoding %T: %v", v, err))
	}
	return raw
}

func toJSON(obj any) any {
	raw, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		panic(err)
	}
	return out
}

func pointerKey(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// diffOps is the JSON patch that takes a to b (lists replaced whole).
func diffOps(path string, a, b any) []jsonOp {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if reflect.DeepEqual(a, b) {
			return nil
		}
		return []jsonOp{{Op: "replace", Path: path, Value: b}}
	}
	var ops []jsonOp
	for _, k := range unionKeys(am, bm) {
		av, ain := am[k]
		bv, bin := bm[k]
		p := path + "/" + pointerKey(k)
		switch {
		case ain && !bin:
			ops = append(ops, jsonOp{Op: "remove", Path: p})
		case !ain && bin:
			ops = append(ops, jsonOp{Op: "add", Path: p, Value: bv})
		default:
			ops = append(ops, diffOps(p, av, bv)...)
		}
	}
	return ops
}

// mergeDiff is the JSON merge patch that takes a to b.
func mergeDiff(a, b any) any {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		return b
	}
	out := map[string]any{}
	for _, k := range unionKeys(am, bm) {
		av, ain := am[k]
		bv, bin := bm[k]
		switch {
		case ain && !bin:
			out[k] = nil
		case !ain && bin:
			out[k] = bv
		case !reflect.DeepEqual(av, bv):
			out[k] = mergeDiff(av, bv)
		}
	}
	return out
}

func dropNulls(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, x := range m {
		if x != nil {
			out[k] = dropNulls(x)
		}
	}
	return out
}

func unionKeys(a, b map[string]any) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
