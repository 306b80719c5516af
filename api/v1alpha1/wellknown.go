package v1alpha1

// Names the controller and the clients agree on.
const (
	// LeaseTokenFinalizer is kept on every Lease the controller manages. A
	// deleted Lease lingers until the controller has recorded its last
	// fencing token in the lock's status (and no live holder remains), so a
	// recreated Lease continues from it and no token is handed out twice.
	// Clients only take Leases that carry it.
	LeaseTokenFinalizer = "locks.frontdesk.dev/fencing-token"
	// LockCleanupFinalizer is kept on every DistributedLock so that deleting
	// the lock deletes its Lease, also where no garbage collector runs.
	LockCleanupFinalizer = "locks.frontdesk.dev/lease-cleanup"
	// LockNameLabel is set on Leases the controller manages: the name of the
	// DistributedLock they back. A Lease that carries it but no controller
	// owner reference is the retired record of a deleted lock's fencing
	// tokens; a new lock of that name adopts it and continues from them.
	LockNameLabel = "locks.frontdesk.dev/lock"
	// LockUIDAnnotation on a Lease is the UID of the DistributedLock that
	// controls it. frontdesk puts no owner reference on a Lease: the garbage
	// collector would then delete a Lease that a lock had adopted (or the
	// record of a deleted lock's tokens) when the lock is deleted with
	// foreground propagation. Clients grant themselves only a Lease whose
	// annotation names the lock they read.
	LockUIDAnnotation = "locks.frontdesk.dev/lock-uid"
	// LeaseOriginAnnotation on a Lease says how the controller came to
	// manage it: LeaseOriginCreated or LeaseOriginAdopted. A created Lease
	// outlives its lock as the record of its tokens; an adopted one is
	// handed back as it is when the lock is deleted.
	LeaseOriginAnnotation = "locks.frontdesk.dev/origin"
	// LeaseOriginCreated: frontdesk created the Lease.
	LeaseOriginCreated = "created"
	// LeaseOriginAdopted: the Lease existed and the lock adopted it.
	LeaseOriginAdopted = "adopted"
	// RevokedAnnotation on a Lease names the holder identity whose
	// candidates-mode grant the controller revoked; the lock is handed on
	// once that pod is gone or the hand-off delay has passed.
	RevokedAnnotation = "locks.frontdesk.dev/revoked"
	// LeaseDurationAnnotation on a Lease is the lease duration, in whole
	// seconds, every grant on it must carry (the lock's
	// spec.leaseDurationSeconds as the manager last wrote it). Only the
	// manager writes it; the lease-guard policy refuses a grant whose
	// spec.leaseDurationSeconds differs, and a renewal that changes it, so
	// nobody judges expiry by a duration a participant chose.
	LeaseDurationAnnotation = "locks.frontdesk.dev/lease-duration"
	// LapsedAnnotation on a Lease is the leaseTransitions of a grant the
	// controller saw go unrenewed for its lease duration, on its own clock.
	// A grant is lapsed while the annotation equals the Lease's
	// leaseTransitions; only then may someone other than its holder take
	// the lock over (the lease-guard policy), and its holder may no longer
	// renew it. Only the manager writes it.
	LapsedAnnotation = "locks.frontdesk.dev/lapsed"
	// HolderPrincipalAnnotation on a Lease is who holds the current grant:
	// the principal (see the lease-principal policy) of the request that
	// made the grant, or of the waiter a release handed it to. The
	// apiserver's admission policy writes it; only that principal renews,
	// releases or hands the grant on.
	HolderPrincipalAnnotation = "locks.frontdesk.dev/holder-principal"
	// TokenEpochAnnotation on a Lease is its token epoch: a lock's fencing
	// token is the epoch times 2^31 plus spec.leaseTransitions (an int32).
	// When leaseTransitions reaches its maximum, the controller starts the
	// next epoch (leaseTransitions back to 0) once the lock is free, so
	// tokens keep rising. Only the manager writes it; absent means 0.
	TokenEpochAnnotation = "locks.frontdesk.dev/token-epoch"
)
