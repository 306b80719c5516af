package leaderelection

import (
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The contract: after a successful write whose record names this process
// with renewTime in second s, no other party can take the Lease over
// before firstSent(s) plus the lease duration, where firstSent(s) is the
// start, on the local monotonic clock, of the first write this Lock sent
// naming itself with renewTime in second s (failed writes included). The
// Term's window ends a safety margin before that. It holds only while the
// seconds sent never go back: a write whose second is older than one
// already sent ends the live Term before it is sent and begins none. Why
// (client-go compares records to the second; a failed write may have
// landed): docs/leader-election.md, "The window counts from the first
// sending".
type firstSent struct {
	set    bool
	second int64     // the latest renewTime second sent
	at     time.Time // when the first write with that second was sent
}

// renewSecond is the wall-clock second of the record's renewTime, as
// client-go's JSON of the record shows it.
func renewSecond(ler *resourcelock.LeaderElectionRecord) int64 {
	return ler.RenewTime.Unix()
}

// send notes a write of a record with renewTime second sec, starting at
// start. It reports false when sec is older than a second already sent: the
// record may look like one whose first sending is forgotten.
func (f *firstSent) send(sec int64, start time.Time) bool {
	switch {
	case !f.set || sec > f.second:
		*f = firstSent{set: true, second: sec, at: start}
	case sec < f.second:
		return false
	}
	return true
}

// since is firstSent(sec): when the first write with renewTime second sec
// was sent, and false when that is not known.
func (f *firstSent) since(sec int64) (time.Time, bool) {
	if !f.set || sec != f.second {
		return time.Time{}, false
	}
	return f.at, true
}
