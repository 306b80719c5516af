package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Prefixes of the label and annotations the controller puts on the pod that
// holds a lock. The full key is the prefix followed by PodKeyName(lock).
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

// PodNameOf returns the pod part of a holder identity ("<pod>_<suffix>"),
// or the whole identity when it has no separator.
func PodNameOf(identity string) string {
	name, _, _ := strings.Cut(identity, IdentitySeparator)
	return name
}

// PodUIDOf returns the pod UID a holder identity carries
// ("<pod>_<uid>[_<suffix>]", the UID in its 36-character text form), or ""
// when it carries none. The controller marks a pod as a lock's holder only
// when the identity names that pod and carries its UID, so a workload
// cannot have a pod it does not run marked by choosing its identity.
func PodUIDOf(identity string) string {
	parts := strings.SplitN(identity, IdentitySeparator, 3)
	if len(parts) < 2 || !isUUID(parts[1]) {
		return ""
	}
	return parts[1]
}

// MayHold reports whether a pod with the given annotations opted in to
// being marked as the holder of lockName (MayHoldAnnotation).
func MayHold(podAnnotations map[string]string, lockName string) bool {
	for name := range strings.SplitSeq(podAnnotations[MayHoldAnnotation], ",") {
		if name = strings.TrimSpace(name); name == "*" || name == lockName {
			return true
		}
	}
	return false
}

// PodIdentity is the holder identity of a pod: "<pod>_<uid>", followed by
// "_<suffix>" when suffix is not empty.
func PodIdentity(podName, uid, suffix string) string {
	id := podName + IdentitySeparator + uid
	if suffix != "" {
		id += IdentitySeparator + suffix
	}
	return id
}

// isUUID reports whether s has the 8-4-4-4-12 hexadecimal form of a UID.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// maxKeyName is the longest name part of a label or annotation key.
const maxKeyName = 63

// PodKeyName is the name part of the pod label and annotation keys for a
// lock: the lock's name when it fits in 63 characters, else its first 54
// characters, a dash and 8 hex digits of its SHA-256.
func PodKeyName(lockName string) string {
	if len(lockName) <= maxKeyName {
		return lockName
	}
	sum := sha256.Sum256([]byte(lockName))
	return strings.TrimRight(lockName[:54], "-.") + "-" + hex.EncodeToString(sum[:])[:8]
}

// HolderLabelKey is the label marking the pod that holds lockName.
func HolderLabelKey(lockName string) string { return HolderLabelPrefix + PodKeyName(lockName) }

// TokenAnnotationKey is the annotation with the holder pod's fencing token.
func TokenAnnotationKey(lockName string) string { return TokenAnnotationPrefix + PodKeyName(lockName) }

// AcquiredAnnotationKey is the annotation with the holder pod's grant time.
func AcquiredAnnotationKey(lockName string) string {
	return AcquiredAnnotationPrefix + PodKeyName(lockName)
}
