package v1alpha1

// The keys of the protocol: every finalizer, label and annotation that
// frontdesk and its clients write on Leases and pods is defined here, and
// the lists at the end are what code iterates when it treats them as a set.

// Finalizers, labels and annotations of the lock and its Lease.
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
	// BrokenAtAnnotation names the token a break raised the Lease to, so
	// that status can tell a break from holders that came and went unseen;
	// the next grant drops it.
	BrokenAtAnnotation = "locks.frontdesk.dev/broken-at"
	// PolicyLabel marks the admission policies frontdesk ships, so the
	// manager finds them whatever their names: PolicyLabelLeaseGuard on the
	// lease-guard policy and its binding.
	PolicyLabel = "locks.frontdesk.dev/policy"
	// PolicyLabelLeaseGuard is PolicyLabel's value on the lease guard.
	PolicyLabelLeaseGuard = "lease-guard"
)

// Keys of the queue of waiters and of the grant's marks on a Lease (see
// package lease for the queue).
const (
	// QueueEntryPrefix starts the key of a place in the queue: the prefix
	// and the ticket. Its value is "<priority>,<seq>,<identity>" (see
	// Waiter).
	QueueEntryPrefix = "queue.locks.frontdesk.dev/"
	// QueuedByPrefix starts the key of the annotation naming who took a
	// place in the queue: the prefix and the ticket. Its value is the
	// principal of the request that registered (see Principal), written by
	// the apiserver's admission policy, never by a client, so that nobody
	// but that principal removes the place (the lease-guard policy).
	QueuedByPrefix = "queued-by.locks.frontdesk.dev/"
	// PodTicketPrefix starts the ticket of a place the controller registers
	// for a pod that runs holding the lock (RunsHoldingAnnotation): the
	// prefix and the pod's UID, with identity "<pod>_<uid>". Such tickets
	// are the manager's alone: the lease-guard policy refuses them to
	// everyone else.
	PodTicketPrefix = "pod-"
	// TicketAnnotation names the ticket of the waiter a release handed the
	// lock to. Only the waiter holding that ticket may take the grant up,
	// so two processes sharing an identity cannot both believe they hold it.
	TicketAnnotation = "locks.frontdesk.dev/granted-ticket"
	// HandedOffByAnnotation names the holder whose release handed the lock
	// to the current one (so status can say HandedOff, not TakenOver).
	HandedOffByAnnotation = "locks.frontdesk.dev/handed-off-by"
	// GrantNonceAnnotation names the attempt that wrote a client's own
	// grant (a random value per write). A client whose grant's answer never
	// came releases the grant only if it carries its nonce: holder and
	// token alone do not tell its grant from one that another process
	// sharing its identity wrote with the same next token.
	GrantNonceAnnotation = "locks.frontdesk.dev/grant-nonce"
	// FrontLabelPrefix starts the key of a label that the holder's writes
	// set for each of the queue's first FrontLength waiters: the prefix and
	// the waiter's ticket. A waiter further back watches the Lease with a
	// selector on its own key (FrontSelector) and hears of nothing until it
	// moves up to the front, instead of decoding every renewal and
	// registration. The labels only wake waiters: nobody judges a grant by
	// them, and a label left on a waiter pushed back (a higher priority
	// registered ahead of it) only makes it hear more.
	FrontLabelPrefix = "front.locks.frontdesk.dev/"
)

// Keys on pods. The label and annotations the controller puts on the pod
// that holds a lock are a prefix followed by PodKeyName(lock).
const (
	// HolderLabelPrefix: label "true" on the pod holding the lock, for a
	// Service to select the current holder.
	HolderLabelPrefix = "holder.locks.frontdesk.dev/"
	// TokenAnnotationPrefix: the holder's fencing token.
	TokenAnnotationPrefix = "token.locks.frontdesk.dev/"
	// AcquiredAnnotationPrefix: when the grant was made (RFC 3339, as
	// written in the Lease by the grantor).
	AcquiredAnnotationPrefix = "acquired.locks.frontdesk.dev/"
	// CandidateGrantAnnotation on a Lease is the identity the controller
	// last granted the lock to in candidates mode. When it equals the
	// current holder, the grant is the controller's to renew or hand off.
	CandidateGrantAnnotation = "locks.frontdesk.dev/candidate-grant"
	// ParticipantLabel, set to "true" on a pod, makes the pod one that
	// frontdesk watches: a candidate in candidates mode (when the lock's
	// selector also picks it) or a pod that can be marked as a library
	// holder (with MayHoldAnnotation). The manager caches and watches only
	// such pods, not every pod of the cluster.
	ParticipantLabel = "locks.frontdesk.dev/participant"
	// MayHoldAnnotation on a pod lists (comma-separated, or "*" for any)
	// the locks of its namespace that it may be marked as the holder of
	// when a client of the library holds them as the pod's identity. A pod
	// that does not list a lock is never marked for it, so nobody can have
	// a pod marked (and a Service route to it) by holding a lock under that
	// pod's identity: the pod's owner opts in. Candidates-mode grants need
	// no such consent: the lock's own selector chose the pod.
	MayHoldAnnotation = "locks.frontdesk.dev/may-hold"
	// RunsHoldingAnnotation on a pod names the lock (in the pod's
	// namespace) the pod runs holding: with AdmissionGate among its
	// scheduling gates, the controller queues the pod for the lock, grants
	// it the lock in its turn, writes its token annotation and only then
	// removes the gate; it holds the grant on the pod's behalf until the
	// pod is finished.
	RunsHoldingAnnotation = "locks.frontdesk.dev/runs-holding"
	// AdmissionGate is the scheduling gate that keeps a pod that runs
	// holding a lock from being scheduled before it holds it.
	AdmissionGate = "locks.frontdesk.dev/admission"
	// AdmittedGrantAnnotation on a Lease names the grant the controller
	// holds for an admitted pod: "<identity>,<fencing token>". When it
	// names the current holder and token, the grant is the controller's to
	// renew and to end; only the manager writes it.
	AdmittedGrantAnnotation = "locks.frontdesk.dev/admitted-grant"
	// IdentitySeparator separates the pod name from the rest of a holder
	// identity: "<pod>_<suffix>". It cannot occur in a pod name.
	IdentitySeparator = "_"
)

// Keys of the fencing policy (config/fencing-policy) on the objects it
// fences: an object opts in with FencedLabel, and each write names the lock
// and carries the fencing token of the writer's grant. The policy refuses a
// write whose token is malformed, lower than the object's or the lock's, or
// above any the lock granted, and one that removes or changes these keys.
const (
	// FencedLabel, set to "true" on an object, opts it in: the policy's
	// bindings select objects by it.
	FencedLabel = "locks.frontdesk.dev/fenced"
	// FencingLockAnnotation on a fenced object names the DistributedLock (in
	// the object's namespace) whose holders write it. It may not change once
	// set.
	FencingLockAnnotation = "locks.frontdesk.dev/fencing-lock"
	// FencingTokenAnnotation on a fenced object is the fencing token of the
	// grant under which it was last written, in decimal.
	FencingTokenAnnotation = "locks.frontdesk.dev/fencing-token"
)

// ManagerAnnotations are the annotations on a lock's Lease that only the
// frontdesk manager writes (the lease-guard policy refuses them to
// everyone else), and that a hand-back removes. TokenEpochAnnotation is
// manager-only too but not listed: a Lease keeps its epoch for good, so
// that its tokens never go back, even after a hand-back.
var ManagerAnnotations = []string{
	LockUIDAnnotation, LeaseOriginAnnotation, CandidateGrantAnnotation, RevokedAnnotation,
	LeaseDurationAnnotation, LapsedAnnotation, AdmittedGrantAnnotation,
}

// GrantAnnotations are the marks that describe a Lease's current grant; a
// new grant or a release drops the previous grant's.
var GrantAnnotations = []string{
	TicketAnnotation, HandedOffByAnnotation, GrantNonceAnnotation, HolderPrincipalAnnotation, BrokenAtAnnotation,
}
