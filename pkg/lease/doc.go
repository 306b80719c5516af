// Package lease is what the frontdesk controller and the client library
// share about a lock's coordination.k8s.io/v1 Lease: how to read it and the
// writes they make to it. It does no I/O; callers send what it builds.
//
// It holds:
//   - The record (record.go): Record, the fields a holder changes when it
//     acquires, renews or releases, and Observer, which times how long a
//     record has stayed unchanged on the local monotonic clock (expiry is
//     judged that way, never by comparing renewTime with a wall clock).
//     Token and Epoch read the fencing token; Lapsed tells a grant the
//     controller ended as lapsed from a release.
//   - The queue of waiters (queue.go): one pair of annotations per place,
//     read by Queue and Place; written by ExactRegistration (an exact
//     Update), Registration and Withdrawal (merge patches that conflict with
//     no other write); the turns of a free lock (Turn) and the front labels
//     that wake the first FrontLength waiters (FrontSelector).
//   - The patches (writes.go, on the Patch of patch.go): grant, renew,
//     release, hand-off and break, which clients send, and lapse and the
//     removal of passed-over places, which the controller sends (it also
//     writes the grant, release and hand-off of a lock-admitted pod from
//     them). Each tests first what the write was judged on, so it lands
//     only while that still holds.
//   - The edits (edit.go): a grant, renewal or release, raising the token
//     to a floor, and starting a token epoch, each a modified copy of a
//     whole Lease that the controller writes with an Update carrying the
//     resourceVersion it read.
//   - Which annotations on a Lease are frontdesk's (keys.go; the keys
//     themselves are defined in api/v1alpha1's keys.go), and which lock
//     controls a Lease (control.go).
package lease
