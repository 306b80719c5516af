package lease

import (
	"math"
	"regexp"
	"strconv"
	"strings"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
)

// The grammar of a lock's Lease: the one definition of every value that
// participants write and that frontdesk reads, in the form both readers
// take it. The lease-guard policy (config/lease-policy) matches the same
// patterns with CEL's matches() (RE2, like Go's regexp) and reads numbers
// only from values they accept, so that what the apiserver lets a
// participant write, Go reads the same way: a value Go would skip, the
// apiserver refuses. The patterns are ASCII-only, so that a string's length
// is the same in bytes (Go) and in code points (CEL). A differential test
// (test/guard) evaluates the policy's CEL against these functions on fuzzed
// inputs.
//
// Numbers are canonical: decimal digits, no sign but a leading '-' on a
// negative priority, no leading zeros, no "-0"; so a number has exactly one
// spelling, and Go rendering a number it parsed gives back the same string.
const (
	// IdentityPattern is a holder identity: 1 to MaxIdentityLength
	// printable ASCII characters, not starting or ending with a space.
	IdentityPattern = `^[!-~](?:[ -~]{0,251}[!-~])?$`
	// TicketPattern is a ticket: what follows the queue's key prefixes, and
	// the name part of its front label (so at most 40 characters: "pod-"
	// and a UID for the manager's places of lock-admitted pods).
	TicketPattern = `^[a-z0-9](?:[-a-z0-9]{0,38}[a-z0-9])?$`
	// NoncePattern is a grant's nonce (GrantNonceAnnotation).
	NoncePattern = `^[A-Za-z0-9-]{1,64}$`
	// PrincipalPattern is a principal (see Principal): an optional pod UID
	// and a username of 1 to MaxUsernameLength printable ASCII characters
	// without spaces.
	PrincipalPattern = `^(?:pod=[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12} )?user=[!-~]{1,340}$`
	// PlacePattern is the value of a place in the queue:
	// "<priority>,<seq>,<identity>". The priority must also be within
	// int32 (MinPriority to MaxPriority); seq runs from 1 to MaxSeq.
	PlacePattern = `^(0|-?[1-9][0-9]{0,9}),([1-9][0-9]{0,14}),([!-~](?:[ -~]{0,251}[!-~])?)$`
	// NumberPattern is a non-negative number written by the manager or a
	// break (lease-duration, lapsed, token-epoch, broken-at): canonical,
	// below 10^18.
	NumberPattern = `^(?:0|[1-9][0-9]{0,17})$`
)

// Bounds of the grammar and of the queue. With them, the annotations that
// participants can add to a Lease stay well below the apiserver's limit of
// 256 KiB for all of a Lease's annotations together, whatever the number of
// participants: MaxPlaces places of at most MaxPlaceBytes each.
const (
	// MaxIdentityLength bounds a holder identity.
	MaxIdentityLength = 253
	// MaxUsernameLength bounds the username in a principal (a
	// ServiceAccount's is at most 339 characters).
	MaxUsernameLength = 340
	// MaxPrincipalLength bounds a principal.
	MaxPrincipalLength = len("pod=00000000-0000-0000-0000-000000000000 user=") + MaxUsernameLength
	// MaxTicketLength bounds a ticket.
	MaxTicketLength = 40
	// MaxSeq is the highest seq of a place. A new place takes a seq no more
	// than one above the highest in the queue, so reaching it takes 10^15
	// registrations.
	MaxSeq = 999_999_999_999_999
	// MinPriority and MaxPriority bound a place's priority (int32).
	MinPriority = math.MinInt32
	MaxPriority = math.MaxInt32
	// MaxPlaces bounds the queue: a waiter that finds it full waits
	// unregistered, behind everyone registered.
	MaxPlaces = 256
	// MaxPlacesPerPrincipal bounds the places one principal (one pod, or
	// one user outside pods) holds in a lock's queue.
	MaxPlacesPerPrincipal = 16
	// MaxPlacesPerUser bounds the places of one user (all the pods of one
	// ServiceAccount together) in a lock's queue.
	MaxPlacesPerUser = 64
	// MaxPlaceBytes is the most a place adds to the Lease's annotations:
	// its two keys and their values.
	MaxPlaceBytes = len(locksv1alpha1.QueueEntryPrefix) + MaxTicketLength + len("-2147483648,999999999999999,") + MaxIdentityLength +
		len(locksv1alpha1.QueuedByPrefix) + MaxTicketLength + MaxPrincipalLength
)

var (
	identityRE  = regexp.MustCompile(IdentityPattern)
	ticketRE    = regexp.MustCompile(TicketPattern)
	nonceRE     = regexp.MustCompile(NoncePattern)
	principalRE = regexp.MustCompile(PrincipalPattern)
	placeRE     = regexp.MustCompile(PlacePattern)
	numberRE    = regexp.MustCompile(NumberPattern)
)

// ValidIdentity reports whether s is a holder identity of the grammar.
func ValidIdentity(s string) bool { return identityRE.MatchString(s) }

// ValidTicket reports whether s is a ticket of the grammar.
func ValidTicket(s string) bool { return ticketRE.MatchString(s) }

// ValidNonce reports whether s is a grant nonce of the grammar.
func ValidNonce(s string) bool { return nonceRE.MatchString(s) }

// ValidPrincipal reports whether s is a principal of the grammar.
func ValidPrincipal(s string) bool { return principalRE.MatchString(s) }

// ParseNumber reads a non-negative number of the grammar (NumberPattern).
func ParseNumber(s string) (int64, bool) {
	if !numberRE.MatchString(s) {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// ParseDurationSeconds reads the lease duration the manager writes
// (LeaseDurationAnnotation): a number of the grammar that is a
// spec.leaseDurationSeconds, 1 to math.MaxInt32.
func ParseDurationSeconds(s string) (int32, bool) {
	n, ok := ParseNumber(s)
	if !ok || n < 1 || n > math.MaxInt32 {
		return 0, false
	}
	return int32(n), true
}

// ParsePlace reads the place with ticket from its annotation value. It
// accepts exactly what the grammar does (TicketPattern, PlacePattern, the
// priority within int32), and renders back to the same value (see
// entryValue).
func ParsePlace(ticket, value string) (Waiter, bool) {
	if !ticketRE.MatchString(ticket) {
		return Waiter{}, false
	}
	m := placeRE.FindStringSubmatch(value)
	if m == nil {
		return Waiter{}, false
	}
	priority, err1 := strconv.ParseInt(m[1], 10, 64)
	seq, err2 := strconv.ParseInt(m[2], 10, 64)
	if err1 != nil || err2 != nil || priority < MinPriority || priority > MaxPriority {
		return Waiter{}, false
	}
	return Waiter{Identity: m[3], Ticket: ticket, Priority: int32(priority), Seq: seq}, true
}

// PodUIDExtra is the user extra that a ServiceAccount token bound to a pod
// carries: the pod's UID.
const PodUIDExtra = "authentication.kubernetes.io/pod-uid"

// Principal is who a request comes from, as grants and places record it
// (HolderPrincipalAnnotation, QueuedByPrefix): "pod=<pod uid> user=<username>"
// for a token bound to a pod, else "user=<username>". The lease-guard
// policy builds the same string from the request's user and refuses a grant
// or a place that records any other; a principal outside the grammar
// (ValidPrincipal) cannot hold or queue.
func Principal(username string, extra map[string][]string) string {
	if uids := extra[PodUIDExtra]; len(uids) > 0 {
		return "pod=" + uids[0] + " user=" + username
	}
	return "user=" + username
}

// PrincipalPodUID is the pod UID of a principal of the grammar, or "" when
// it names no pod (or is not of the grammar).
func PrincipalPodUID(principal string) string {
	if !principalRE.MatchString(principal) {
		return ""
	}
	pod, _, found := strings.Cut(principal, " ")
	if !found {
		return ""
	}
	return strings.TrimPrefix(pod, "pod=")
}

// PrincipalUser is the user part of a principal ("user=<username>"), the
// same for all the pods of one ServiceAccount, or "" when it is not of the
// grammar.
func PrincipalUser(principal string) string {
	if !principalRE.MatchString(principal) {
		return ""
	}
	if _, user, pod := strings.Cut(principal, " "); pod {
		return user // the pod UID has no space, nor has the username
	}
	return principal
}
