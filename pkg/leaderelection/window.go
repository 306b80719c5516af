package leaderelection

import (
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The safe window of a Term is counted from a moment no other party can
// have started its own wait before. Another party (a client-go candidate,
// frontdesk's controller, a frontdesk client) restarts its wait only when
// the record it reads differs from the one it read before, and it may read
// a record as soon as the write that carries it was sent. client-go
// compares the record's JSON, where renewTime is encoded to the second;
// frontdesk's lease.Observer compares the fields exactly. So two records
// this process writes can look the same to someone only if their renewTime
// falls in the same wall-clock second; whatever else they differ in, some
// observer may not tell them apart, and a write that failed (no answer)
// may still have been stored and read.
//
// The contract: after a successful write whose record names this process
// with renewTime in second s, no other party can take the Lease over
// before firstSent(s) plus the lease duration, where firstSent(s) is the
// start, on the local monotonic clock, of the first write this Lock sent
// naming itself with renewTime in second s (failed writes included). The
// Term's window ends a safety margin before that.
//
// Why it holds: a party takes over only by a compare-and-swap on the
// record it last read, once that record has looked unchanged to it for a
// lease duration. While this process leads, the record stored is the last
// of its own writes that landed, with some second s' >= s (its writes carry
// non-decreasing seconds, see below), and the party has read records that
// look like it since some moment t. What it read at t had been sent by then,
// and looks like the stored record, so its renewTime is in second s': t >=
// firstSent(s') >= firstSent(s), because a second's first write comes after
// every write of an earlier second. (Moments on two machines compare in
// real time; each measures the lease duration on its own clock, and the
// safety margin covers their rates differing.)
//
// That last step needs the seconds this process sends never to go back.
// client-go takes renewTime from the wall clock once per attempt and may
// resend the same record, so they go back only when the wall clock steps
// back. A write whose second is older than one already sent may look like
// a record whose first sending was forgotten (only the latest second is
// kept): its window cannot be counted, so it ends the live Term before it
// is sent and begins none.
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
