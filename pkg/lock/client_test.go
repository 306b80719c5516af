package lock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

func TestDefaultIdentityIsUniquePerProcessAndNamesThePod(t *testing.T) {
	t.Setenv("POD_NAME", "billing-7d9f-x2x")
	a, b := DefaultIdentity(), DefaultIdentity()
	if a == b {
		t.Errorf("two identities are equal: %s", a)
	}
	if !regexp.MustCompile(`^billing-7d9f-x2x_[0-9a-f]{8}$`).MatchString(a) {
		t.Errorf("identity %q does not look like <pod>_<8 hex>", a)
	}
	if PodNameOf(a) != "billing-7d9f-x2x" {
		t.Errorf("PodNameOf(%q) = %q", a, PodNameOf(a))
	}
	if PodNameOf("custom") != "custom" {
		t.Error("an identity without a separator is its own pod name")
	}
	const uid = "0b6f8c1e-3d2a-4f5b-9c7e-1a2b3c4d5e6f"
	t.Setenv("POD_UID", uid)
	withUID := DefaultIdentity()
	if !regexp.MustCompile(`^billing-7d9f-x2x_` + uid + `_[0-9a-f]{8}$`).MatchString(withUID) {
		t.Errorf("identity %q does not look like <pod>_<uid>_<8 hex>", withUID)
	}
	if locksv1alpha1.PodUIDOf(withUID) != uid || PodNameOf(withUID) != "billing-7d9f-x2x" {
		t.Errorf("identity %q does not carry pod and UID", withUID)
	}
	t.Setenv("POD_UID", "not-a-uid")
	if got := DefaultIdentity(); locksv1alpha1.PodUIDOf(got) != "" {
		t.Errorf("a malformed $POD_UID made it into %q", got)
	}
	t.Setenv("POD_UID", "")
	t.Setenv("POD_NAME", "")
	host, _ := os.Hostname()
	if got := DefaultIdentity(); !strings.HasPrefix(got, host+locksv1alpha1.IdentitySeparator) {
		t.Errorf("without POD_NAME the identity %q does not start with the hostname %q", got, host)
	}
}

func TestMayHaveLanded(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"no answer", errors.New("connection reset by peer"), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "update", 1), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"request timeout", apierrors.NewTimeoutError("slow", 1), true},
		{"forbidden", apierrors.NewForbidden(gr, "billing", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("bad"), false},
		{"too many requests", apierrors.NewTooManyRequests("later", 1), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := mayHaveLanded(tc.err); got != tc.want {
				t.Errorf("mayHaveLanded(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// Only failures that pass by themselves keep a waiter in the queue.
func TestPassingReadError(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"server timeout", context.Background(), apierrors.NewServerTimeout(gr, "get", 1), true},
		{"internal error", context.Background(), apierrors.NewInternalError(errors.New("etcd")), true},
		{"unavailable", context.Background(), apierrors.NewServiceUnavailable("starting"), true},
		{"too many requests", context.Background(), apierrors.NewTooManyRequests("slow down", 1), true},
		{"connection refused", context.Background(), fmt.Errorf("get: %w", syscall.ECONNREFUSED), true},
		{"unexpected EOF", context.Background(), fmt.Errorf("get: %w", io.ErrUnexpectedEOF), true},
		{"forbidden", context.Background(), apierrors.NewForbidden(gr, "billing", errors.New("rbac")), false},
		{"unauthorized", context.Background(), apierrors.NewUnauthorized("who are you"), false},
		{"bad request", context.Background(), apierrors.NewBadRequest("no"), false},
		{"something else", context.Background(), errors.New("x509: certificate signed by unknown authority"), false},
		{"the caller gave up", cancelled, apierrors.NewServerTimeout(gr, "get", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := passingReadError(tc.ctx, fmt.Errorf("reading lease: %w", tc.err)); got != tc.want {
				t.Errorf("passingReadError = %v, want %v", got, tc.want)
			}
		})
	}
}
