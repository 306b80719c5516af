package v1alpha1

// Condition types and reasons of DistributedLock status. They are part of
// the API: clients (the lock library, kubectl dlock) read them.

// Condition types set on DistributedLock status.
const (
	// ConditionReady is True when the lock's Lease exists, is owned by the
	// lock and is in sync with it (finalizer in place, token not behind).
	ConditionReady = "Ready"
	// ConditionHeld is True while a holder owns the lock and the controller
	// has observed a renewal within the lease duration.
	ConditionHeld = "Held"
	// ConditionGuarded is True when the lease-guard admission policy
	// (config/lease-policy) is installed and bound to the lock's namespace:
	// the apiserver then keeps participants from ending each other's
	// grants. False says what is missing.
	ConditionGuarded = "Guarded"
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
	// ReasonLeaseInUse: a Lease of that name exists, frontdesk did not
	// create it and someone holds it; it is adopted once free (or at once
	// with spec.leaseAdoption: WhileHeld).
	ReasonLeaseInUse = "LeaseInUse"
	// ReasonLeaseRetiredByOther: a Lease of that name keeps the fencing
	// tokens of another, deleted lock; this lock may not take them over.
	ReasonLeaseRetiredByOther = "LeaseRetiredByOther"
	// ReasonLeaseNameChanged: spec.leaseName no longer names the Lease the
	// lock was recorded on (status.leaseName); the controller keeps using
	// the recorded one.
	ReasonLeaseNameChanged = "LeaseNameChanged"
	// ReasonInvalidSelector: spec.candidates.podSelector cannot select
	// pods; candidates mode grants nothing until it is fixed.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonDeleting: the lock is being deleted; it waits for its holder to
	// release or lapse, then keeps its Lease as the record of its fencing
	// tokens.
	ReasonDeleting = "Deleting"
	// ReasonTokensExhausted: the Lease's leaseTransitions is at its maximum
	// and a live grant holds it: no further grant can be made until the
	// holder releases (or the controller marks its grant lapsed), when the
	// controller starts a new token epoch.
	ReasonTokensExhausted = "TokensExhausted"
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
	// ReasonRevoked: in candidates mode, the holder pod stopped being
	// eligible; the controller revoked its grant and hands the lock on once
	// the pod is gone or the hand-off delay has passed.
	ReasonRevoked = "Revoked"
	// ReasonInvalidGrant: the Lease names a new holder without a new
	// fencing token (written by hand, not granted): it is not a valid grant
	// and nobody should act on it.
	ReasonInvalidGrant = "InvalidGrant"
)

// Reasons for the Guarded condition.
const (
	// ReasonLeaseGuarded: the lease-guard policy is installed and a binding
	// of it that denies applies to the lock's namespace.
	ReasonLeaseGuarded = "LeaseGuarded"
	// ReasonLeaseGuardMissing: no lease-guard policy, or no binding of it
	// that denies and applies to the lock's namespace: nothing keeps
	// participants from ending each other's grants.
	ReasonLeaseGuardMissing = "LeaseGuardMissing"
)
