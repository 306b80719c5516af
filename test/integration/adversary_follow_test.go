package integration

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// followObjects hands every object list returns to add, then every change
// a watch from the list's resourceVersion shows (deleted for a delete
// event), until ctx ends; a watch that ends is opened again from the last
// version seen, so no change is missed. what names the objects in a
// failure.
func followObjects[T interface {
	runtime.Object
	GetResourceVersion() string
}](ctx context.Context, t *testing.T, what string, list func(context.Context) ([]T, string, error),
	watchFrom func(context.Context, metav1.ListOptions) (watch.Interface, error), add func(obj T, deleted bool)) {
	t.Helper()
	items, rv, err := list(ctx)
	if err != nil {
		t.Fatalf("listing %s: %v", what, err)
	}
	for _, obj := range items {
		add(obj, false)
	}
	go func() {
		for ctx.Err() == nil {
			w, err := watchFrom(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				obj, ok := ev.Object.(T)
				if !ok {
					continue
				}
				rv = obj.GetResourceVersion()
				if ev.Type != watch.Bookmark {
					add(obj, ev.Type == watch.Deleted)
				}
			}
			w.Stop()
		}
	}()
}
