package v1alpha1

// Condition types and reasons of DistributedLock status. They are part of
// the API: clients (the lock library, kubectl lock) read them.

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
