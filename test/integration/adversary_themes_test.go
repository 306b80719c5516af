package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary's themes on a lock's Lease, and the values at the
// grammar's edges (pkg/lease/grammar.go) they write.

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func chance(r *rand.Rand, p float64) bool { return r.Float64() < p }

// numberEdges are spellings of numbers that two readers may take
// differently, and bounds of int32, int64 and the grammar.
var numberEdges = []string{
	"0", "1", "-0", "00", "01", "+1", " 1", "1 ", "1e3", "0x10", "١", "１", "2147483647", "2147483648", "-2147483648",
	"-2147483649", "9223372036854775807", "9223372036854775808", "-9223372036854775808", "999999999999999999",
	"1000000000000000000", "999999999999999", "1000000000000000", "", "NaN", "1.5", "-1", "99999999999999999999999",
}

func numberEdge(r *rand.Rand, around int64) string {
	if chance(r, 0.3) {
		return strconv.FormatInt(around+int64(r.IntN(5))-2, 10)
	}
	return pick(r, numberEdges...)
}

// identityEdge is a holder identity at or past the grammar's edges.
func identityEdge(r *rand.Rand) string {
	return pick(r, "x", strings.Repeat("a", 253), strings.Repeat("a", 254), " lead", "trail ", "ålice", "a\x00b", "a\nb",
		"tab\tx", "a,b", "", "日本", strings.Repeat("é", 127), "\u202eevil", "\x1b[31mred", "1,2,3", "-", "~")
}

// identity is one the adversary holds or queues as: its own, an honest
// one it saw on the Lease, or an edge.
func identity(r *rand.Rand, w *view) string {
	switch n := r.IntN(10); {
	case n < 5:
		return fmt.Sprintf("mallory-%d", r.IntN(4))
	case n < 7:
		if ids := honestIdentities(w); len(ids) > 0 {
			return pick(r, ids...)
		}
		return "alice-0"
	case n == 7 && len(w.podIDs) > 0:
		// A pod's identity: its own pods', another's (the honest
		// participants', the pod creator's, which may consent to marks).
		return pick(r, w.podIDs...)
	default:
		return identityEdge(r)
	}
}

// honestIdentities are the identities on the Lease that are not the
// adversary's: its holder's, and its places'.
func honestIdentities(w *view) []string {
	var out []string
	if h := lease.Holder(w.cur); h != "" && !strings.HasPrefix(h, "mallory") {
		out = append(out, h)
	}
	for _, p := range w.queue {
		if !strings.HasPrefix(p.Identity, "mallory") {
			out = append(out, p.Identity)
		}
	}
	return out
}

func randomHex(r *rand.Rand, n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[r.IntN(16)]
	}
	return string(b)
}

func randomUUID(r *rand.Rand) string {
	h := randomHex(r, 32)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ticketEdge is a ticket like an honest client's (16 hex digits) or one at
// the grammar's edges.
func ticketEdge(r *rand.Rand) string {
	if chance(r, 0.6) {
		return randomHex(r, 16)
	}
	return pick(r, "0", "00000000", "a", "-a", "a-", "A", "a_b", strings.Repeat("a", 40), strings.Repeat("a", 41),
		locksv1alpha1.PodTicketPrefix+randomUUID(r), "pod-x", "", "a.b", "é", "0-0", strings.Repeat("0", 39)+"1")
}

// principal is one the adversary writes where a principal belongs.
func principal(r *rand.Rand, a *adversary, w *view) string {
	switch n := r.IntN(20); {
	case n < 13:
		return w.self.principal
	case n < 15:
		return w.sibling.principal
	case n < 17:
		if len(a.honest) > 0 {
			return pick(r, a.honest...)
		}
		return w.sibling.principal
	default:
		return pick(r, "user="+w.self.username, managerSA, "user="+managerSA, "pod="+randomUUID(r)+" user="+w.self.username, "",
			"user=x y", "pod="+lease.PrincipalPodUID(w.self.principal)+" user=system:serviceaccount:"+w.cur.Namespace+":alice",
			"user="+strings.Repeat("a", 341), "user=system:masters")
	}
}

func nonceEdge(r *rand.Rand) string {
	if chance(r, 0.6) {
		return randomHex(r, 16)
	}
	return pick(r, "", "a", strings.Repeat("a", 64), strings.Repeat("a", 65), "a_b", "é", "a b")
}

func timeEdge(r *rand.Rand) *metav1.MicroTime {
	now := time.Now()
	switch r.IntN(10) {
	case 0:
		return nil
	case 1:
		return &metav1.MicroTime{Time: now.Add(-time.Hour)}
	case 2:
		return &metav1.MicroTime{Time: now.Add(time.Hour)}
	case 3:
		return &metav1.MicroTime{}
	case 4:
		return &metav1.MicroTime{Time: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}
	default:
		return &metav1.MicroTime{Time: now}
	}
}

func durationEdge(r *rand.Rand, lock int32) *int32 {
	if chance(r, 0.7) {
		return &lock
	}
	return pick(r, nil, new(int32(0)), new(int32(1)), new(int32(-1)), new(lock+1), new(int32(math.MaxInt32)), new(int32(math.MinInt32)))
}

// seq is a seq for a new place, around the highest in the queue.
func seq(r *rand.Rand, maxSeq int64) string {
	switch n := r.IntN(20); {
	case n < 9:
		return strconv.FormatInt(maxSeq+1, 10)
	case n < 16:
		return strconv.FormatInt(max(maxSeq, 1), 10) // beside the last one registered
	default:
		return pick(r, strconv.FormatInt(maxSeq-1, 10), strconv.FormatInt(maxSeq+2, 10), "1", "0", "01",
			strconv.FormatInt(maxSeq+1, 10)+"0", "999999999999999", "1000000000000000", "-1", "+"+strconv.FormatInt(maxSeq+1, 10),
			"0"+strconv.FormatInt(maxSeq+1, 10))
	}
}

func priority(r *rand.Rand) string {
	if chance(r, 0.75) {
		return "0"
	}
	return pick(r, "-1", "-2147483648", "-2147483649", "1", "2147483647", "2147483648", "00", "-0", "+0", "٠", "-01", " 0")
}

// placeValue is "<priority>,<seq>,<identity>", or something near it.
func placeValue(r *rand.Rand, w *view) string {
	v := priority(r) + "," + seq(r, w.maxSeq) + "," + identity(r, w)
	if chance(r, 0.05) {
		return pick(r, v+",", "0,1", "", v+" ", "0;1;x", strings.Repeat("9", 300))
	}
	return v
}

// --- the themes ---

// leaseThemes are the adversary's themes on a lock's Lease.
func leaseThemes() []theme {
	return []theme{
		{"grant", 10, drawGrant},
		{"holder-op", 10, drawHolderOp},
		{"break", 3, drawBreak},
		{"grant-fields", 6, drawGrantFields},
		{"marks", 8, drawMarks},
		{"manager-keys", 6, drawManagerKeys},
		{"place-add", 14, drawPlaceAdd},
		{"place-change", 8, drawPlaceChange},
		{"place-withdraw", 8, drawWithdraw},
		{"front-label", 5, drawFrontLabel},
		{"metadata", 7, drawMetadata},
		{"honest-shaped", 10, drawHonestShaped},
		{"shadow-place", 6, drawShadowPlace},
		{"raw", 4, drawRaw},
		{"delete", 2, func(*adversary, *rand.Rand, *view) move { return move{pod: -1, del: true, desc: "delete the Lease"} }},
	}
}

func ann(l *coordinationv1.Lease) map[string]string {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	return l.Annotations
}

func lbls(l *coordinationv1.Lease) map[string]string {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	return l.Labels
}

// drawGrant takes the lock (free or not), with fields at their edges.
func drawGrant(a *adversary, r *rand.Rand, w *view) move {
	token := w.token + 1
	switch r.IntN(10) {
	case 0:
		token = w.token
	case 1:
		token = w.token + 2
	case 2:
		token = pick(r, w.token-1, 0, math.MaxInt32, -1)
	}
	holder := identity(r, w)
	dur := durationEdge(r, w.duration)
	acq, ren := timeEdge(r), timeEdge(r)
	if chance(r, 0.6) {
		ren = acq
	}
	p := principal(r, a, w)
	nonce := nonceEdge(r)
	noNonce := chance(r, 0.2)
	marks := r.IntN(8)
	ticket := pick(r, append(ownPlaces(w.cur, w.self.principal), ticketEdge(r))...)
	leave := chance(r, 0.3)
	return move{pod: -1, desc: fmt.Sprintf("grant token %d holder %q principal %q", token, trunc(holder), p), edit: func(l *coordinationv1.Lease) {
		t32 := int32(token)
		l.Spec.LeaseTransitions, l.Spec.HolderIdentity = &t32, &holder
		l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = dur, acq, ren
		for _, k := range locksv1alpha1.GrantAnnotations {
			delete(ann(l), k)
		}
		ann(l)[locksv1alpha1.HolderPrincipalAnnotation] = p
		if !noNonce {
			ann(l)[locksv1alpha1.GrantNonceAnnotation] = nonce
		}
		switch marks {
		case 0:
			ann(l)[locksv1alpha1.TicketAnnotation] = ticket
		case 1:
			ann(l)[locksv1alpha1.HandedOffByAnnotation] = "alice-0"
		case 2:
			ann(l)[locksv1alpha1.BrokenAtAnnotation] = strconv.FormatInt(token, 10)
		}
		if leave {
			delete(ann(l), lease.EntryKey(ticket))
			delete(ann(l), lease.QueuedByKey(ticket))
		}
	}}
}

// drawHolderOp renews, releases or hands on the grant: the adversary's
// own when it holds one (for a while, then it lets go), else the honest
// holder's; sometimes with one more change.
func drawHolderOp(a *adversary, r *rand.Rand, w *view) move {
	holderPod := a.podOf(w.cur.Annotations[locksv1alpha1.HolderPrincipalAnnotation])
	mine := holderPod >= 0 && lease.Holder(w.cur) != ""
	pod := -1
	if mine && chance(r, 0.9) {
		pod = holderPod
	}
	op := pick(r, "renew", "renew", "release", "hand-off", "hand-off-other", "break")
	if mine && op == "renew" && grantAge(w.cur) > holdLimit(a.seed, w.token, w.duration) {
		op = pick(r, "release", "hand-off", "none") // it let go; "none" lets the grant lapse
	}
	extra := chance(r, 0.35)
	var ex move
	if extra {
		ex = pick(r, drawMarks, drawGrantFields, drawPlaceAdd, drawFrontLabel, drawPlaceChange)(a, r, w)
	}
	return move{pod: pod, desc: fmt.Sprintf("%s (adversary holds: %v) extra %v %s", op, mine, extra, ex.desc), edit: func(l *coordinationv1.Lease) {
		out := l
		switch op {
		case "renew":
			out, _ = lease.RenewPatch(l, time.Now()).ApplyTo(l)
		case "release":
			out, _ = lease.ReleasePatch(l).ApplyTo(l)
		case "hand-off":
			if p, _, ok, err := lease.HandOffPatch(l, lease.Holder(l), time.Duration(w.duration)*time.Second, time.Now()); ok && err == nil {
				out, _ = p.ApplyTo(l)
			}
		case "hand-off-other":
			out = handOffTo(l, w)
		case "break":
			if p, err := lease.BreakPatch(l); err == nil {
				out, _ = p.ApplyTo(l)
			}
		}
		if out != nil && out != l {
			*l = *out
		}
		if extra && ex.edit != nil {
			ex.edit(l)
		}
	}}
}

// handOffTo is a hand-off to the last place of the queue, not its head.
func handOffTo(l *coordinationv1.Lease, w *view) *coordinationv1.Lease {
	q := lease.Queue(l)
	if len(q) == 0 {
		return l
	}
	last := q[len(q)-1]
	out := l.DeepCopy()
	t := metav1.NewMicroTime(time.Now())
	out.Spec.HolderIdentity, out.Spec.LeaseTransitions = &last.Identity, new(int32(w.token+1))
	out.Spec.AcquireTime, out.Spec.RenewTime, out.Spec.LeaseDurationSeconds = &t, &t, new(w.duration)
	a := ann(out)
	a[locksv1alpha1.HolderPrincipalAnnotation] = last.Principal
	a[locksv1alpha1.TicketAnnotation] = last.Ticket
	a[locksv1alpha1.HandedOffByAnnotation] = lease.Holder(l)
	delete(a, lease.EntryKey(last.Ticket))
	delete(a, lease.QueuedByKey(last.Ticket))
	return out
}

// grantAge is how long ago the Lease's grant was acquired.
func grantAge(l *coordinationv1.Lease) time.Duration {
	if l.Spec.AcquireTime == nil {
		return 0
	}
	return time.Since(l.Spec.AcquireTime.Time)
}

// holdLimit is how long the adversary renews a grant of token before it
// lets go: up to two lease durations (it may delay others as long as it
// renews, which is allowed; the run is about what else it can do).
func holdLimit(seed uint64, token int64, duration int32) time.Duration {
	r := rand.New(rand.NewPCG(seed, uint64(token)|1<<62))
	return time.Duration(r.Float64() * 2 * float64(duration) * float64(time.Second))
}

func drawBreak(a *adversary, r *rand.Rand, w *view) move {
	brokenAt := numberEdge(r, w.token+1)
	withMark := chance(r, 0.5)
	return move{pod: -1, desc: "break, broken-at " + brokenAt, edit: func(l *coordinationv1.Lease) {
		l.Spec.LeaseTransitions = new(int32(w.token + 1))
		l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil, nil
		if withMark {
			ann(l)[locksv1alpha1.BrokenAtAnnotation] = brokenAt
		}
	}}
}

// drawGrantFields changes one field of the grant as it stands.
func drawGrantFields(a *adversary, r *rand.Rand, w *view) move {
	field := pick(r, "holder", "token", "token", "acquireTime", "renewTime", "duration", "clear-holder")
	holder, delta := identity(r, w), pick(r, int64(1), -1, 2, 1000)
	tm, dur := timeEdge(r), durationEdge(r, w.duration+int32(r.IntN(3))-1)
	return move{pod: -1, desc: "change " + field, edit: func(l *coordinationv1.Lease) {
		switch field {
		case "holder":
			l.Spec.HolderIdentity = &holder
		case "token":
			l.Spec.LeaseTransitions = new(int32(w.token + delta))
		case "acquireTime":
			l.Spec.AcquireTime = tm
		case "renewTime":
			l.Spec.RenewTime = tm
		case "duration":
			l.Spec.LeaseDurationSeconds = dur
		case "clear-holder":
			l.Spec.HolderIdentity = nil
		}
	}}
}

var grantMarks = []string{locksv1alpha1.HolderPrincipalAnnotation, locksv1alpha1.TicketAnnotation, locksv1alpha1.HandedOffByAnnotation,
	locksv1alpha1.GrantNonceAnnotation, locksv1alpha1.BrokenAtAnnotation}

// drawMarks sets, changes or removes one of the grant's marks.
func drawMarks(a *adversary, r *rand.Rand, w *view) move {
	key := pick(r, grantMarks...)
	var value string
	switch key {
	case locksv1alpha1.HolderPrincipalAnnotation:
		value = principal(r, a, w)
	case locksv1alpha1.TicketAnnotation:
		value = pick(r, append(queueTickets(w), ticketEdge(r))...)
	case locksv1alpha1.HandedOffByAnnotation:
		value = identity(r, w)
	case locksv1alpha1.GrantNonceAnnotation:
		value = nonceEdge(r)
	default:
		value = numberEdge(r, w.token)
	}
	remove := chance(r, 0.3)
	return move{pod: -1, desc: fmt.Sprintf("mark %s = %q (remove %v)", key, trunc(value), remove), edit: func(l *coordinationv1.Lease) {
		if remove {
			delete(ann(l), key)
		} else {
			ann(l)[key] = value
		}
	}}
}

var managerKeys = []string{locksv1alpha1.LockUIDAnnotation, locksv1alpha1.LeaseOriginAnnotation, locksv1alpha1.CandidateGrantAnnotation,
	locksv1alpha1.RevokedAnnotation, locksv1alpha1.LeaseDurationAnnotation, locksv1alpha1.LapsedAnnotation,
	locksv1alpha1.TokenEpochAnnotation, locksv1alpha1.AdmittedGrantAnnotation}

// drawManagerKeys sets, changes or removes one of the manager's keys.
func drawManagerKeys(a *adversary, r *rand.Rand, w *view) move {
	key := pick(r, managerKeys...)
	value := numberEdge(r, w.token)
	switch key {
	case locksv1alpha1.LockUIDAnnotation:
		value = pick(r, randomUUID(r), "", w.cur.Annotations[key]+"x")
	case locksv1alpha1.LapsedAnnotation:
		value = pick(r, strconv.FormatInt(w.token, 10), value)
	case locksv1alpha1.LeaseDurationAnnotation:
		value = pick(r, "1", "60", "0", value)
	}
	remove := chance(r, 0.25)
	return move{pod: -1, desc: fmt.Sprintf("manager key %s = %q (remove %v)", key, value, remove), edit: func(l *coordinationv1.Lease) {
		if remove {
			delete(ann(l), key)
		} else {
			ann(l)[key] = value
		}
	}}
}

// drawPlaceAdd registers places: one mostly, sometimes many at once, up to
// and past the bounds per principal, per user and in all.
func drawPlaceAdd(a *adversary, r *rand.Rand, w *view) move {
	n := 1
	if chance(r, 0.25) {
		n = pick(r, 2, 3, 15, 16, 17, 33, 64, 65, 257)
	}
	type place struct{ ticket, value, by string }
	places := make([]place, n)
	for i := range places {
		by := principal(r, a, w)
		if chance(r, 0.03) {
			by = "-" // no queued-by
		}
		places[i] = place{ticket: ticketEdge(r), value: placeValue(r, w), by: by}
	}
	front := chance(r, 0.3)
	return move{pod: -1, desc: fmt.Sprintf("register %d places, first %q = %q by %q", n, places[0].ticket, trunc(places[0].value), places[0].by),
		edit: func(l *coordinationv1.Lease) {
			for _, p := range places {
				ann(l)[lease.EntryKey(p.ticket)] = p.value
				if p.by != "-" {
					ann(l)[lease.QueuedByKey(p.ticket)] = p.by
				}
				if front {
					lbls(l)[locksv1alpha1.FrontLabelPrefix+p.ticket] = "true"
				}
			}
		}}
}

// drawPlaceChange changes or removes a place, the adversary's own or
// another's, whole or one key of it.
func drawPlaceChange(a *adversary, r *rand.Rand, w *view) move {
	tickets := ownPlaces(w.cur, w.self.principal)
	if len(w.queue) > 0 && (len(tickets) == 0 || chance(r, 0.5)) {
		tickets = queueTickets(w)
	}
	if len(tickets) == 0 {
		return drawPlaceAdd(a, r, w)
	}
	ticket := pick(r, tickets...)
	op := pick(r, "value", "queued-by", "remove", "remove-entry", "remove-queued-by", "re-register")
	value, by := placeValue(r, w), principal(r, a, w)
	return move{pod: -1, desc: fmt.Sprintf("%s of place %s (%q, %q)", op, ticket, trunc(value), by), edit: func(l *coordinationv1.Lease) {
		switch op {
		case "value":
			ann(l)[lease.EntryKey(ticket)] = value
		case "queued-by":
			ann(l)[lease.QueuedByKey(ticket)] = by
		case "remove":
			delete(ann(l), lease.EntryKey(ticket))
			delete(ann(l), lease.QueuedByKey(ticket))
		case "remove-entry":
			delete(ann(l), lease.EntryKey(ticket))
		case "remove-queued-by":
			delete(ann(l), lease.QueuedByKey(ticket))
		case "re-register":
			ann(l)[lease.EntryKey(ticket)] = value
			ann(l)[lease.QueuedByKey(ticket)] = by
		}
	}}
}

// drawWithdraw removes places of the adversary's own: one, some or all.
func drawWithdraw(a *adversary, r *rand.Rand, w *view) move {
	pod := r.IntN(len(a.pods))
	mine := ownPlaces(w.cur, a.pods[pod].principal)
	if len(mine) == 0 {
		return drawPlaceAdd(a, r, w)
	}
	var gone []string
	switch r.IntN(3) {
	case 0:
		gone = []string{pick(r, mine...)}
	case 1:
		gone = mine
	default:
		for _, t := range mine {
			if chance(r, 0.5) {
				gone = append(gone, t)
			}
		}
	}
	withLabels := chance(r, 0.7)
	return move{pod: pod, theme: "place-withdraw", desc: fmt.Sprintf("withdraw %d of %d own places", len(gone), len(mine)),
		edit: func(l *coordinationv1.Lease) { removePlaces(l, gone, withLabels) }}
}

func removePlaces(l *coordinationv1.Lease, tickets []string, withLabels bool) {
	for _, t := range tickets {
		delete(ann(l), lease.EntryKey(t))
		delete(ann(l), lease.QueuedByKey(t))
		if withLabels {
			delete(lbls(l), locksv1alpha1.FrontLabelPrefix+t)
		}
	}
}

// yieldMove withdraws every place of a pod of the adversary (the honest
// side is registering), or, with none left, draws anything but a new
// place.
func yieldMove(a *adversary, r *rand.Rand, w *view) move {
	for _, pod := range r.Perm(len(a.pods)) {
		if mine := ownPlaces(w.cur, a.pods[pod].principal); len(mine) > 0 {
			return move{pod: pod, theme: "place-withdraw", desc: fmt.Sprintf("withdraw all %d own places (yield)", len(mine)),
				kinds: []string{"json-patch", "merge-patch", "strategic-merge", "update"},
				edit:  func(l *coordinationv1.Lease) { removePlaces(l, mine, true) }}
		}
	}
	m := pick(r, drawMarks, drawManagerKeys, drawGrantFields, drawMetadata, drawBreak)(a, r, w)
	m.theme = "yield: other"
	return m
}

// queueTickets are the tickets of the queue the view shows.
func queueTickets(w *view) []string {
	out := make([]string, 0, len(w.queue)+1)
	for _, p := range w.queue {
		out = append(out, p.Ticket)
	}
	return out
}

// drawFrontLabel adds, changes or removes a front label.
func drawFrontLabel(a *adversary, r *rand.Rand, w *view) move {
	ticket := pick(r, append(queueTickets(w), ticketEdge(r))...)
	value := pick(r, "true", "true", "false", "", "yes")
	remove := chance(r, 0.4)
	return move{pod: -1, desc: fmt.Sprintf("front label %s = %q (remove %v)", ticket, value, remove), edit: func(l *coordinationv1.Lease) {
		if remove {
			delete(lbls(l), locksv1alpha1.FrontLabelPrefix+ticket)
		} else {
			lbls(l)[locksv1alpha1.FrontLabelPrefix+ticket] = value
		}
	}}
}

// drawMetadata changes what no operation names: other annotations and
// labels, the lock label, finalizers, owner references, managed fields,
// spec.strategy and spec.preferredHolder.
func drawMetadata(a *adversary, r *rand.Rand, w *view) move {
	what := pick(r, "annotation", "big-annotation", "label", "lock-label", "finalizer-add", "finalizer-remove", "owner-add",
		"owner-remove", "managed-fields", "strategy", "preferred-holder", "annotations-nil", "labels-nil")
	key := pick(r, "example.com/x", "kubectl.kubernetes.io/last-applied-configuration", "locks.frontdesk.dev/other", "x")
	value := pick(r, "v", "", strings.Repeat("v", 63))
	return move{pod: -1, desc: "metadata: " + what, edit: func(l *coordinationv1.Lease) {
		switch what {
		case "annotation":
			ann(l)[key] = value
		case "big-annotation":
			ann(l)[key] = strings.Repeat("x", 200<<10)
		case "label":
			lbls(l)[key] = value
		case "lock-label":
			if chance(r, 0.5) {
				delete(lbls(l), locksv1alpha1.LockNameLabel)
			} else {
				lbls(l)[locksv1alpha1.LockNameLabel] = "other"
			}
		case "finalizer-add":
			l.Finalizers = append(l.Finalizers, pick(r, "example.com/keep", locksv1alpha1.LeaseTokenFinalizer))
		case "finalizer-remove":
			l.Finalizers = slices.DeleteFunc(l.Finalizers, func(f string) bool { return f == locksv1alpha1.LeaseTokenFinalizer })
		case "owner-add":
			l.OwnerReferences = append(l.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x",
				UID: types.UID(randomUUID(r))})
		case "owner-remove":
			l.OwnerReferences = nil
		case "managed-fields":
			if chance(r, 0.5) {
				l.ManagedFields = []metav1.ManagedFieldsEntry{{}}
			} else {
				l.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "frontdesk", Operation: metav1.ManagedFieldsOperationUpdate,
					APIVersion: "coordination.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{}}`)}}
			}
		case "strategy":
			l.Spec.Strategy = new(coordinationv1.CoordinatedLeaseStrategy("OldestEmulationVersion"))
		case "preferred-holder":
			l.Spec.PreferredHolder = new("mallory-0")
		case "annotations-nil":
			l.Annotations = nil
		case "labels-nil":
			l.Labels = nil
		}
	}}
}

// drawShadowPlace keeps a place of the adversary's flickering right
// behind the front of the queue, without a front label: registered, then
// withdrawn at the next draw. A holder or waiter whose copy shows it adds
// its front label to its hand-off or grant, and that write lands after the
// place is gone.
func drawShadowPlace(a *adversary, r *rand.Rand, w *view) move {
	for i, p := range w.queue {
		if pod := a.podOf(p.Principal); pod >= 0 && i < lease.FrontLength+1 {
			if _, labelled := w.cur.Labels[locksv1alpha1.FrontLabelPrefix+p.Ticket]; !labelled {
				ticket := p.Ticket
				return move{pod: pod, desc: "withdraw the shadow place " + ticket, kinds: []string{"merge-patch", "json-patch"},
					edit: func(l *coordinationv1.Lease) { removePlaces(l, []string{ticket}, false) }}
			}
		}
	}
	ticket, value := randomHex(r, 16), fmt.Sprintf("0,%d,%s", w.maxSeq+1, identity(r, w))
	return move{pod: -1, desc: "register a shadow place " + ticket, kinds: []string{"merge-patch", "json-patch"},
		edit: func(l *coordinationv1.Lease) {
			ann(l)[lease.EntryKey(ticket)] = value
			ann(l)[lease.QueuedByKey(ticket)] = w.self.principal
		}}
}

// drawHonestShaped is a write an honest client would send, built with
// pkg/lease (the adversary as a participant among others): a registration,
// a withdrawal, a grant of a free lock.
func drawHonestShaped(a *adversary, r *rand.Rand, w *view) move {
	op := pick(r, "register", "register-exact", "withdraw", "grant")
	switch op {
	case "register":
		patch, _, err := lease.Registration(w.cur, lease.Waiter{Identity: identity(r, w), Ticket: randomHex(r, 16), Principal: w.self.principal})
		if err != nil {
			break
		}
		var m map[string]any
		_ = json.Unmarshal(patch, &m)
		return move{pod: w.pod, desc: "registration " + string(patch), kinds: []string{"merge-patch"}, edit: func(l *coordinationv1.Lease) {
			applyMerge(l, patch)
		}}
	case "register-exact":
		p, _, err := lease.ExactRegistration(w.cur, lease.Waiter{Identity: identity(r, w), Ticket: randomHex(r, 16), Principal: w.self.principal})
		if err != nil {
			break
		}
		return move{pod: w.pod, desc: "exact registration", kinds: []string{"update", "json-patch"}, edit: func(l *coordinationv1.Lease) {
			if out, err := p.ApplyTo(l); err == nil {
				*l = *out
			}
		}}
	case "withdraw":
		if mine := ownPlaces(w.cur, w.self.principal); len(mine) > 0 {
			patch, _ := lease.Withdrawal(pick(r, mine...))
			return move{pod: w.pod, theme: "place-withdraw", desc: "withdrawal " + string(patch), kinds: []string{"merge-patch"},
				edit: func(l *coordinationv1.Lease) { applyMerge(l, patch) }}
		}
	case "grant":
		if lease.Holder(w.cur) == "" {
			mine := ownPlaces(w.cur, w.self.principal)
			ticket := ""
			if len(mine) > 0 {
				ticket = pick(r, mine...)
			}
			p, err := lease.GrantPatch(w.cur, identity(r, w), w.self.principal, ticket, randomHex(r, 16), time.Duration(w.duration)*time.Second, time.Now())
			if err == nil {
				return move{pod: w.pod, desc: "grant of a free lock", kinds: []string{"json-patch", "update"}, edit: func(l *coordinationv1.Lease) {
					if out, err := p.ApplyTo(l); err == nil {
						*l = *out
					}
				}}
			}
		}
	}
	return drawPlaceAdd(a, r, w)
}

// applyMerge applies a JSON merge patch of annotations and labels to l.
func applyMerge(l *coordinationv1.Lease, patch []byte) {
	var p struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
			Labels      map[string]*string `json:"labels"`
		} `json:"metadata"`
	}
	if json.Unmarshal(patch, &p) != nil {
		return
	}
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(ann(l), k)
		} else {
			ann(l)[k] = *v
		}
	}
	for k, v := range p.Metadata.Labels {
		if v == nil {
			delete(lbls(l), k)
		} else {
			lbls(l)[k] = *v
		}
	}
}

// drawRaw is a JSON patch with values a typed Lease cannot hold.
func drawRaw(a *adversary, r *rand.Rand, w *view) move {
	ops := pick(r,
		[]jsonOp{{Op: "replace", Path: "/spec/leaseTransitions", Value: int64(math.MaxInt32) + 1}},
		[]jsonOp{{Op: "replace", Path: "/spec/leaseTransitions", Value: strconv.FormatInt(w.token+1, 10)}},
		[]jsonOp{{Op: "replace", Path: "/spec/leaseTransitions", Value: float64(w.token) + 1.5}},
		[]jsonOp{{Op: "replace", Path: "/spec/leaseTransitions", Value: nil}},
		[]jsonOp{{Op: "remove", Path: "/spec/leaseTransitions"}},
		[]jsonOp{{Op: "replace", Path: "/spec/leaseDurationSeconds", Value: int64(1) << 40}},
		[]jsonOp{{Op: "add", Path: "/metadata/annotations/" + pointerKey(lease.EntryKey(randomHex(r, 16))), Value: 12}},
		[]jsonOp{{Op: "add", Path: "/metadata/annotations/" + pointerKey(locksv1alpha1.HolderPrincipalAnnotation), Value: []string{w.self.principal}}},
		[]jsonOp{{Op: "replace", Path: "/spec/holderIdentity", Value: 7}},
		[]jsonOp{{Op: "add", Path: "/spec/bogus", Value: "x"}},
		[]jsonOp{{Op: "replace", Path: "/metadata/annotations", Value: nil}},
		[]jsonOp{{Op: "move", From: "/metadata/annotations/" + pointerKey(locksv1alpha1.HolderPrincipalAnnotation), Path: "/metadata/annotations/x"}},
		[]jsonOp{{Op: "copy", From: "/metadata/annotations/" + pointerKey(locksv1alpha1.HolderPrincipalAnnotation),
			Path: "/metadata/annotations/" + pointerKey(lease.QueuedByKey("copied"))},
			{Op: "add", Path: "/metadata/annotations/" + pointerKey(lease.EntryKey("copied")), Value: fmt.Sprintf("0,%d,mallory-c", w.maxSeq+1)}},
	)
	b := mustJSON(ops)
	return move{pod: -1, raw: ops, desc: "raw " + string(b)}
}
