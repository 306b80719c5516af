package controllers

// Condition types set on DistributedLock status.
const (
	// ConditionReady is True when the lock's Lease exists, is owned by the
	// lock and is in sync with it (finalizer in place, token not behind).
	ConditionReady = "Ready"
	// ConditionHeld is True while a holder owns the lock and the controller
	// has observed a renewal within the lease duration.
	ConditionHeld = "Held"
)

// Reasons for the Ready condition.
const (
	// ReasonLeaseReady: the Lease exists and is in sync.
	ReasonLeaseReady = "LeaseReady"
	// ReasonLeaseMissing: the Lease does not exist (yet); the controller is
	// creating it.
	ReasonLeaseMissing = "LeaseMissing"
	// ReasonLeaseTerminating: the Lease is being deleted; the controller
	// records its last fencing token and then recreates it.
	ReasonLeaseTerminating = "LeaseTerminating"
	// ReasonLeaseOwnedByOther: a Lease of that name is controlled by another
	// object, so this lock cannot use it.
	ReasonLeaseOwnedByOther = "LeaseOwnedByOther"
)

// Reasons for the Held condition.
const (
	// ReasonHeld: a holder owns the lock and renews it.
	ReasonHeld = "Held"
	// ReasonNotHeld: nobody holds the lock.
	ReasonNotHeld = "NotHeld"
	// ReasonExpired: the holder has not renewed within the lease duration, as
	// observed by the controller.
	ReasonExpired = "Expired"
	// ReasonLeaseUnavailable: the Lease cannot be read, so nobody can hold
	// the lock through it.
	ReasonLeaseUnavailable = "LeaseUnavailable"
)

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
)
