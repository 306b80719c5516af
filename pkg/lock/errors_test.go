package lock

import (
	"errors"
	"testing"
)

func TestHeldErrorSaysWhoAndUntilWhen(t *testing.T) {
	err := error(&HeldError{Lock: "ns/billing", Holder: "a_1234", Token: 9, FreeAt: t0})
	if !errors.Is(err, ErrHeld) {
		t.Error("HeldError does not match ErrHeld")
	}
	want := "lock ns/billing is held by a_1234 (fencing token 9) until ~2026-12-02T12:00:00Z unless it renews"
	if err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}
