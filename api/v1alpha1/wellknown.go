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
	// DistributedLock they back.
	LockNameLabel = "locks.frontdesk.dev/lock"
)
