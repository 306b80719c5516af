package controllers

// Event reasons recorded on DistributedLocks.
const (
	// EventAcquired: a new grant to a holder when the lock was free.
	EventAcquired = "Acquired"
	// EventRenewed: the first renewal of a grant, or a renewal by a holder
	// whose lease the controller had already seen lapse. Routine renewals
	// are not recorded as events.
	EventRenewed = "Renewed"
	// EventReleased: the holder released the lock.
	EventReleased = "Released"
	// EventExpired: the holder stopped renewing and its lease lapsed.
	EventExpired = "Expired"
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
	// EventTokenFloorRestored: the Lease's token was behind the highest
	// recorded one (it was replaced behind the controller's back); the
	// controller raised it and voided the grant made with the stale token.
	EventTokenFloorRestored = "TokenFloorRestored"
	// EventLeaseConflict: the Lease is controlled by another object.
	EventLeaseConflict = "LeaseConflict"
	// EventHandedOff: in candidates mode, the holder pod stopped being
	// Ready or went away and the lock was granted to the next candidate.
	EventHandedOff = "HandedOff"
	// EventCandidateGone: in candidates mode, the holder pod stopped being
	// Ready and no candidate was left, so the lock was released.
	EventCandidateGone = "CandidateGone"
)
