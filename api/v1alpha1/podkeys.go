package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
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
