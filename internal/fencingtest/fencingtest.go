// Package fencingtest forwards to pkg/fencing/fencingtest, the tests every
// fencing.Guard must pass; they live in the library module so that
// pkg/fencing's own tests need nothing outside it.
package fencingtest

import (
	"testing"

	"github.com/frontdesk-dev/frontdesk/pkg/fencing/fencingtest"
)

// Backend is a Guard under test with the state it protects: a counter.
type Backend = fencingtest.Backend

// Run runs every test on fresh backends from newBackend, one per subtest.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Helper()
	fencingtest.Run(t, newBackend)
}
