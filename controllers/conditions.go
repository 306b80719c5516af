package controllers

// Event reasons recorded on DistributedLocks.
const (
	// EventAcquired: a new grant to a holder when the lock was free.
	EventAcquired = "Acquired"
	// EventRenewed (a Warning): the holder renewed a grant that status
	// already reported as Expired, before the controller ended it as
	// lapsed; writes it made meanwhile must be fenced. No other renewal is
	// recorded as an event.
	EventRenewed = "Renewed"
	// EventReleased: the holder released the lock.
	EventReleased = "Released"
	// EventExpired: the holder stopped renewing and its lease lapsed.
	EventExpired = "Expired"
	// EventHolderProvenDead (a Warning): the pod whose token made the
	// grant was proven dead (proof.go), and the controller ended the grant
	// before its lease ran out.
	EventHolderProvenDead = "HolderProvenDead"
	// EventTakenOver: a new holder was granted the lock while another
	// holder had not released it.
	EventTakenOver = "TakenOver"
	// EventLeaseCreated: the controller created the lock's Lease.
	EventLeaseCreated = "LeaseCreated"
	// EventLeaseRecreated: the Lease had been deleted and was recreated with
	// its fencing token continuing from the highest one recorded.
	EventLeaseRecreated = "LeaseRecreated"
	// EventLeaseAdopted: an existing Lease was adopted by the lock.
	EventLeaseAdopted = "LeaseAdopted"
	// EventTokenEpochStarted: the Lease's leaseTransitions had reached its
	// maximum, and the controller started the next token epoch.
	EventTokenEpochStarted = "TokenEpochStarted"
	// EventTokenFloorRestored: the Lease's token was behind the highest
	// recorded one (it was replaced behind the controller's back); the
	// controller raised it and voided the grant made with the stale token.
	EventTokenFloorRestored = "TokenFloorRestored"
	// EventLeaseConflict: the Lease is controlled by another object.
	EventLeaseConflict = "LeaseConflict"
	// EventHandedOff: in candidates mode, the holder pod stopped being
	// Ready or went away and the lock was granted to the next candidate.
	EventHandedOff = "HandedOff"
	// EventCandidateGone: in candidates mode, the revoked holder pod's
	// hand-off came due and no candidate was left, so the lock was released.
	EventCandidateGone = "CandidateGone"
	// EventRevoked: in candidates mode, the holder pod stopped being
	// eligible (or the lock is being deleted): its marks were removed and its
	// grant revoked; the lock is handed on once the pod is gone or the
	// hand-off delay has passed.
	EventRevoked = "Revoked"
	// EventBroken: the lock was broken (kubectl dlock break): any grant
	// voided and the fencing token raised, so the previous holder is fenced.
	EventBroken = "Broken"
	// EventInvalidGrant: the Lease names a new holder without a new fencing
	// token (a hand edit, not a grant); nobody should act on it.
	EventInvalidGrant = "InvalidGrant"
	// EventRetired: the deleted lock's Lease was kept as the record of its
	// fencing tokens, for a new lock of the same name to continue from.
	EventRetired = "Retired"
	// EventLeaseHandedBack: the deleted lock's Lease, which it had adopted,
	// was handed back as it was (frontdesk deletes no Lease it did not
	// create).
	EventLeaseHandedBack = "LeaseHandedBack"
	// EventSelectorInvalid: spec.candidates.podSelector cannot select pods.
	EventSelectorInvalid = "SelectorInvalid"
	// EventPodNotMarked (a Warning): the holder identity names a pod that
	// consents to marks, but the grant is bound to another principal than
	// that pod: the pod is not marked.
	EventPodNotMarked = "PodNotMarked"
	// EventQueueRepaired (a Warning): the controller removed entries of the
	// queue that nobody could read (outside the grammar) or whose principal
	// is a pod that no longer exists.
	EventQueueRepaired = "QueueRepaired"
	// EventNotPermitted (a Warning, on a pod): the pod's ServiceAccount may
	// not use the lock it names to run holding: it stays gated.
	EventNotPermitted = "NotPermitted"
	// EventPodNameTooLong (a Warning, on a pod): the pod's name is too long
	// for a holder identity ("<pod>_<uid>", at most lease.MaxIdentityLength
	// characters), so it can neither run holding a lock nor be a candidate.
	EventPodNameTooLong = "PodNameTooLong"
	// EventPodStartTimedOut (a Warning): an admitted pod did not start
	// within the lock's spec.podStartTimeoutSeconds: the controller deleted
	// it, and its grant ends once it is gone.
	EventPodStartTimedOut = "PodStartTimedOut"
	// EventPodQueued (on a pod): the controller queued a gated pod for the
	// lock it runs holding; the note says its position.
	EventPodQueued = "PodQueued"
	// EventPodAdmitted: the controller granted the lock to a gated pod,
	// wrote its token annotation and removed its scheduling gate.
	EventPodAdmitted = "PodAdmitted"
	// EventPodReleased: the controller ended the grant it held for an
	// admitted pod (finished, gone, or its node stopped reporting).
	EventPodReleased = "PodReleased"
	// EventLockMissing: a gated pod names a lock that does not exist; it
	// stays gated.
	EventLockMissing = "LockMissing"
	// EventNotGated: a pod names a lock to run holding but carries no
	// admission gate, so it cannot be held back and is not admitted.
	EventNotGated = "NotGated"
	// EventNoLockNamed: a pod carries the admission gate but names no lock;
	// it stays gated.
	EventNoLockNamed = "NoLockNamed"
)
