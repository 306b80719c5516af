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
)
