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
