package guard

import (
	"testing"
)

// The fuzz targets: Go's native fuzzing mutates the values of the grammar
// from the edges above (and the corpus under testdata/fuzz), and each
// input goes through the same differential checks as the tables. `make
// test` runs each for a few seconds, `make fuzz` for FUZZTIME each; a
// disagreement is a failing input that `go test` saves under
// testdata/fuzz/<target>, to be kept there once fixed.

// FuzzPlace: a place's ticket and value, registered by the worker, and
// read from a Lease where queuedBy recorded it.
func FuzzPlace(f *testing.F) {
	for _, e := range placeEdges {
		f.Add(e.ticket, e.value, other)
	}
	f.Add("t-1", "0,1,me", "user=alice")
	f.Add("t-1", "0,1,me", "user=alice smith")
	f.Add("t-1", "0,1,me", "")
	f.Fuzz(func(t *testing.T, ticket, value, queuedBy string) {
		checkRegistration(t, ticket, value)
		checkReading(t, withPlace(lockLease(), ticket, value, &queuedBy))
	})
}

// FuzzQueue: a queue of three places (one fixed, two fuzzed) is read the
// same by both, and handed on only to its head as Go orders it.
func FuzzQueue(f *testing.F) {
	for _, q := range queueEdges {
		if len(q) == 4 {
			f.Add(q[0], q[1], q[2], q[3])
		}
	}
	f.Fuzz(func(t *testing.T, ticketA, valueA, ticketB, valueB string) {
		if ticketA == ticketB || ticketA == "base" || ticketB == "base" {
			return
		}
		l := heldBy(lockLease(), "holder", principalOf(worker()))
		l = withPlace(l, "base", "0,5,base", new(other))
		l = withPlace(l, ticketA, valueA, new(other))
		l = withPlace(l, ticketB, valueB, new(other))
		checkReading(t, l)
		checkHandOff(t, l)
	})
}

// FuzzIdentity: a holder identity, in a grant (Go's GrantPatch) and in a
// place.
func FuzzIdentity(f *testing.F) {
	for _, e := range identityEdges {
		f.Add(e.identity)
	}
	f.Fuzz(func(t *testing.T, identity string) {
		checkGrant(t, identity, "n-2", worker())
		checkRegistration(t, "t-1", "0,1,"+identity)
	})
}

// FuzzNonce: a grant's nonce.
func FuzzNonce(f *testing.F) {
	for _, e := range nonceEdges {
		f.Add(e.nonce)
	}
	f.Fuzz(func(t *testing.T, nonce string) {
		checkGrant(t, "me", nonce, worker())
	})
}

// FuzzPrincipal: the request's user (username, pod UIDs), whose
// principal a grant and a place record.
func FuzzPrincipal(f *testing.F) {
	for _, e := range principalEdges {
		extra := uint8(0)
		uid := podUID
		switch {
		case e.uids == nil:
		case len(e.uids) == 0:
			extra = 3
		case len(e.uids) == 2:
			extra = 2
		default:
			extra, uid = 1, e.uids[0]
		}
		f.Add(e.username, uid, extra)
	}
	f.Fuzz(func(t *testing.T, name, uid string, extra uint8) {
		checkPrincipal(t, fuzzUser(name, uid, extra))
	})
}

// FuzzNumber: a number where the manager writes one (token-epoch,
// lease-duration) and where a break names its token (broken-at).
func FuzzNumber(f *testing.F) {
	for _, e := range numberEdges {
		f.Add(e.s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkNumber(t, s)
	})
}
