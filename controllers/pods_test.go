package controllers

import (
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The apiserver refuses a patch that would change metadata.uid as invalid,
// naming the field: that, and only that, is a pod replaced under its name.
func TestUIDRefusedIsTheApiserverRefusingAnotherUID(t *testing.T) {
	pods := corev1.SchemeGroupVersion.WithKind("Pod").GroupKind()
	uidChanged := apierrors.NewInvalid(pods, "app-0", field.ErrorList{
		field.Invalid(field.NewPath("metadata", "uid"), "b", "field is immutable")})
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"uid changed", uidChanged, true},
		{"uid changed, wrapped", fmt.Errorf("patching: %w", uidChanged), true},
		{"another invalid field", apierrors.NewInvalid(pods, "app-0", field.ErrorList{
			field.Invalid(field.NewPath("metadata", "labels"), "x", "bad")}), false},
		{"a conflict", apierrors.NewConflict(corev1.Resource("pods"), "app-0", errors.New("changed")), false},
		{"not an API error", errors.New("connection reset"), false},
	} {
		if got := uidRefused(tc.err); got != tc.want {
			t.Errorf("%s: uidRefused = %v, want %v", tc.name, got, tc.want)
		}
	}
}
