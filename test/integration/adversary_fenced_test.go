package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// The adversary's fenced-object surface (issue 36): with
// config/fencing-policy installed, the adversary's pods (which hold
// nothing, or a stale token, or now and then the lock itself) write
// claimed tokens to fenced ConfigMaps: the honest holders' ledger, and
// objects of their own. Tokens above the Lease's, huge, negative, with
// leading zeros or a sign, not numbers; the fenced label, the token or the
// lock annotation removed or changed; new fenced objects; the label put
// on an object carrying a token never granted; an object naming a lock
// that does not exist. Every honest grant writes the ledger with its
// token, right after the grant and once more while it holds.

// fencedLedger is the honest holders' fenced object.
const fencedLedger = "ledger"

// fencedSurface sends the adversary's writes to fenced objects.
type fencedSurface struct {
	ns, lock string
	// history records every version of every ConfigMap of the namespace.
	history *configMapHistory

	mu sync.Mutex
	// honestWrites and honestRefused count the honest holders' writes.
	honestWrites, honestRefused int
	// honestRetried counts the honest writes first refused as never
	// granted (the policy's informer behind the grant), which landed
	// when retried.
	honestRetried int
	own           []string
}

// newFencedSurface installs config/fencing-policy, lets the adversary's
// and the honest participants' ServiceAccounts write ConfigMaps (not
// delete them: DELETE is not fenced), creates the ledger with the lock's
// current token, and waits until the policy refuses a malformed token.
func newFencedSurface(t *testing.T, ns, lock string, serviceAccounts []string) *fencedSurface {
	t.Helper()
	installFencingPolicy(t)
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ledger-writer", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}}})).To(Succeed())
	subjects := make([]rbacv1.Subject, 0, len(serviceAccounts))
	for _, sa := range serviceAccounts {
		subjects = append(subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: sa, Namespace: ns})
	}
	g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ledger-writer", Namespace: ns},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "ledger-writer"}, Subjects: subjects})).To(Succeed())
	token := lease.Token(getLease(g, ns, lock))
	g.Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fencedLedger, Namespace: ns, Labels: fencedLabels,
		Annotations: fenced(lock, strconv.FormatInt(token, 10))}, Data: map[string]string{"value": "opened"}})).To(Succeed())
	eventually(t, 20*time.Second, func(g Gomega) { // a dry run: a write that lands before the policy is enforced stays a probe
		cm := &corev1.ConfigMap{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: fencedLedger}, cm)).To(Succeed())
		cm.Annotations[locksv1alpha1.FencingTokenAnnotation] = "x"
		err := k8sClient.Update(ctx, cm, client.DryRunAll)
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the fencing policy is not enforced yet: %v", err)
	})
	for _, sa := range serviceAccounts {
		as := restConfig()
		as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
		eventually(t, 5*time.Second, func(g Gomega) {
			can, err := canI(ctx, as, ns, "patch", "configmaps")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(can).To(BeTrue())
		})
	}
	return &fencedSurface{ns: ns, lock: lock}
}

// honestWrite writes the ledger as an honest holder of token does: a
// merge patch of the token annotation and the data, from the holder's own
// pod. It must land while the grant is live.
func (run *adversaryRun) honestWrite(hg *honestGrant, when string) {
	f := run.adv.fenced
	if f == nil || hg.who.p.pod == nil {
		return
	}
	body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"data":{"value":"%s %s"}}`, locksv1alpha1.FencingTokenAnnotation,
		strconv.FormatInt(hg.token, 10), hg.identity, when)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The policy reads the Lease from the apiserver's informers: a write
	// right after the grant may be refused as never granted for a moment
	// (docs/annotations.md): retried for a second.
	configMaps := kubernetes.NewForConfigOrDie(hg.who.p.cfg).CoreV1().ConfigMaps(run.ns)
	sent, retried := time.Now(), false
	var err error
	for {
		_, err = configMaps.Patch(ctx, fencedLedger, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		if err == nil || !strings.Contains(err.Error(), "was never granted") || time.Since(sent) > time.Second {
			break
		}
		retried = true
		time.Sleep(20 * time.Millisecond)
	}
	live := hg.g.Context().Err() == nil && !hg.released.Load()
	f.mu.Lock()
	f.honestWrites++
	if retried {
		f.honestRetried++
	}
	if err != nil && live {
		f.honestRefused++
	}
	f.mu.Unlock()
	if err != nil && live {
		run.violatef("f", "%s, holding token %d, could not write the fenced ledger with it (%s): %v", hg.identity, hg.token, when, err)
	}
}

// fencedEdge is a claimed token: above the Lease's (by one, two, a
// thousand, the policy's 18-digit bound and past it), below the object's,
// the current one, or not a number the policy reads.
func fencedEdge(r *rand.Rand, leaseToken, objectToken int64) (string, string) {
	switch r.IntN(10) {
	case 0, 1, 2:
		return "above", pick(r, strconv.FormatInt(leaseToken+1, 10), strconv.FormatInt(leaseToken+2, 10), strconv.FormatInt(leaseToken+1000, 10),
			"999999999999999999", "1000000000000000000", "9223372036854775807", "18446744073709551616", strconv.FormatInt(leaseToken+1, 10)+"0")
	case 3, 4:
		return "stale", strconv.FormatInt(max(0, objectToken-int64(1+r.IntN(3))), 10)
	case 5:
		return "current", pick(r, strconv.FormatInt(leaseToken, 10), strconv.FormatInt(objectToken, 10))
	default:
		cur := strconv.FormatInt(leaseToken, 10)
		next := strconv.FormatInt(leaseToken+1, 10)
		return "malformed", pick(r, "-1", "-"+cur, "+"+cur, "0"+cur, "00"+next, " "+cur, cur+" ", "", "NaN", "1e3", "0x10", "١", "１",
			"99999999999999999999", "-0", cur+".0", cur+"\n", "٣", next+"_")
	}
}

// write sends the adversary's fenced write i, from the pod of w.
func (f *fencedSurface) write(ctx context.Context, a *adversary, i uint64, r *rand.Rand, w *view) {
	res := w.self.dyn.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(f.ns)
	leaseToken := w.token
	target := fencedLedger
	f.mu.Lock()
	own := slices.Clone(f.own)
	f.mu.Unlock()
	what := pick(r, "token", "token", "token", "token", "token", "label", "strip", "lock", "create", "create", "relabel", "other-lock")
	if len(own) > 0 && chance(r, 0.3) {
		target = pick(r, own...)
	}
	var req request
	var kind writeKind
	var desc, theme string
	switch what {
	case "create", "other-lock", "relabel":
		name := fmt.Sprintf("adv-cm-%d", i)
		class, token := fencedEdge(r, leaseToken, 0)
		lockName := f.lock
		labels := map[string]any{locksv1alpha1.FencedLabel: "true"}
		switch what {
		case "other-lock":
			lockName = pick(r, "no-such-lock", strings.ToUpper(f.lock), f.lock+" ", "")
			class = "other lock " + strconv.Quote(lockName)
		case "relabel":
			labels = map[string]any{} // created unfenced; the label comes later
			class = "unfenced"
		}
		theme = "fenced: create " + class
		obj := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": f.ns,
			"labels": labels, "annotations": map[string]any{locksv1alpha1.FencingLockAnnotation: lockName, locksv1alpha1.FencingTokenAnnotation: token}},
			"data": map[string]any{"value": "adversary"}}
		req = request{res: res, name: name, after: obj}
		kind = a.kinds["create"]
		desc = fmt.Sprintf("create %s, lock %q, token %q (the Lease's %d)", name, lockName, token, leaseToken)
	default:
		before, err := res.Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			a.stats.add("fenced", "read", "fenced: read", classify(err))
			return
		}
		objectToken, _ := policyToken(before.GetAnnotations()[locksv1alpha1.FencingTokenAnnotation])
		after := before.DeepCopy()
		annotations, labels := after.GetAnnotations(), after.GetLabels()
		if annotations == nil {
			annotations = map[string]string{}
		}
		if labels == nil {
			labels = map[string]string{}
		}
		class, token := fencedEdge(r, leaseToken, objectToken)
		switch what {
		case "token":
			annotations[locksv1alpha1.FencingTokenAnnotation] = token
			desc = fmt.Sprintf("token %q on %s (the object's %d, the Lease's %d)", token, target, objectToken, leaseToken)
		case "label":
			class = pick(r, "removed", "false", "True", "removed with a token above", "true", "true")
			if class == "removed" || class == "removed with a token above" {
				delete(labels, locksv1alpha1.FencedLabel)
			} else {
				labels[locksv1alpha1.FencedLabel] = class
			}
			if class == "removed with a token above" {
				annotations[locksv1alpha1.FencingTokenAnnotation] = strconv.FormatInt(leaseToken+1, 10)
			}
			desc = fmt.Sprintf("fenced label %s on %s", class, target)
		case "strip":
			class = pick(r, "token", "lock", "both")
			if class != "lock" {
				delete(annotations, locksv1alpha1.FencingTokenAnnotation)
			}
			if class != "token" {
				delete(annotations, locksv1alpha1.FencingLockAnnotation)
			}
			desc = fmt.Sprintf("remove the %s annotation(s) of %s", class, target)
		case "lock":
			class = pick(r, "other", "no-such-lock", strings.ToUpper(f.lock), "")
			annotations[locksv1alpha1.FencingLockAnnotation] = class
			annotations[locksv1alpha1.FencingTokenAnnotation] = strconv.FormatInt(leaseToken+1000, 10)
			desc = fmt.Sprintf("point %s at lock %q with token %d", target, class, leaseToken+1000)
			class = "changed"
		}
		theme = "fenced: " + what + " " + class
		after.SetAnnotations(annotations)
		after.SetLabels(labels)
		_ = unstructured.SetNestedField(after.Object, fmt.Sprintf("adversary #%d", i), "data", "value")
		req = request{res: res, name: target, before: before.Object, after: after.Object}
		kind = a.kinds[pick(r, "json-patch", "json-patch", "merge-patch", "merge-patch", "update", "update", "strategic-merge", "apply")]
	}
	sentAt := time.Now()
	body, written, err := kind.send(ctx, r, req)
	if ctx.Err() != nil && err != nil {
		return
	}
	outcome := classify(err)
	if err == nil && what == "create" || err == nil && what == "relabel" {
		f.mu.Lock()
		f.own = append(f.own, req.name)
		f.mu.Unlock()
	}
	a.stats.add("fenced", kind.name(), theme, outcome)
	e := entry{i: i, at: sentAt, pod: w.self.name, kind: kind.name(), theme: theme, desc: desc, body: body, outcome: outcome, err: errText(err)}
	if written != nil {
		e.version = written.GetResourceVersion()
	}
	a.journal.add(e)
}

// policyTokenRE is what the fencing policy reads as a token.
var policyTokenRE = regexp.MustCompile(`^[0-9]{1,18}$`)

// policyToken is the token the policy reads from an annotation value.
func policyToken(v string) (int64, bool) {
	if !policyTokenRE.MatchString(v) {
		return -1, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// configMapVersion is a ConfigMap as a watch event showed it.
type configMapVersion struct {
	at       time.Time
	name, rv string
	deleted  bool
	labelled bool
	label    string
	hasToken bool
	token    string
	hasLock  bool
	lock     string
}

// configMapHistory records every version of every ConfigMap of a
// namespace.
type configMapHistory struct {
	mu       sync.Mutex
	versions []configMapVersion
}

func watchConfigMaps(ctx context.Context, t *testing.T, ns string) *configMapHistory {
	h := &configMapHistory{}
	cms := clientset.CoreV1().ConfigMaps(ns)
	followObjects(ctx, t, "the ConfigMaps of "+ns, func(ctx context.Context) ([]*corev1.ConfigMap, string, error) {
		list, err := cms.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", err
		}
		items := make([]*corev1.ConfigMap, len(list.Items))
		for i := range list.Items {
			items[i] = &list.Items[i]
		}
		return items, list.ResourceVersion, nil
	}, cms.Watch, h.add)
	return h
}

func (h *configMapHistory) add(cm *corev1.ConfigMap, deleted bool) {
	v := configMapVersion{at: time.Now(), name: cm.Name, rv: cm.ResourceVersion, deleted: deleted}
	v.label, v.labelled = cm.Labels[locksv1alpha1.FencedLabel]
	v.token, v.hasToken = cm.Annotations[locksv1alpha1.FencingTokenAnnotation]
	v.lock, v.hasLock = cm.Annotations[locksv1alpha1.FencingLockAnnotation]
	h.mu.Lock()
	defer h.mu.Unlock()
	h.versions = append(h.versions, v)
}

func (h *configMapHistory) all() []configMapVersion {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions)
}

// checkFenced checks the fenced surface's invariants on the ConfigMaps'
// history, against the Lease's history and the lock's status (each as
// received, with a second's slack for the order in which the watches
// deliver):
//
//	(f) every version of a fenced object (the label before or after)
//	    that names the lock keeps the label, the token and the lock
//	    annotation, carries a token the policy reads, not below the
//	    object's previous token, not below the lock's recorded token of a
//	    second before, and not above the Lease's token of a second after:
//	    the object's recorded token never exceeds the lock's; and every
//	    honest holder's write with its token landed (honestWrite).
//
//nolint:gocyclo // a checklist: one branch per invariant (f), read top to bottom
func (run *adversaryRun) checkFenced(cms []configMapVersion, statuses []statusLine) {
	leaseTokenBy := func(at time.Time) int64 {
		best := int64(-1)
		for i := range run.versions {
			if i < len(run.receivedAt) && !run.receivedAt[i].After(at) {
				best = max(best, lease.Token(&run.versions[i]))
			}
		}
		return best
	}
	statusTokenBy := func(at time.Time) int64 {
		best := int64(0)
		for _, st := range statuses {
			if !st.at.After(at) {
				best = max(best, st.token)
			}
		}
		return best
	}
	last := map[string]configMapVersion{}
	reported := map[string]int{}
	report := func(v configMapVersion, format string, args ...any) {
		if reported[v.name]++; reported[v.name] > 3 {
			return
		}
		run.violateAtf(v.at, "", "f", "ConfigMap %s (rv %s): %s", v.name, v.rv, fmt.Sprintf(format, args...))
	}
	for _, v := range cms {
		prev, seen := last[v.name]
		last[v.name] = v
		if v.deleted {
			delete(last, v.name)
			continue
		}
		fencedBefore := seen && prev.labelled && prev.label == "true"
		fencedNow := v.labelled && v.label == "true"
		if !fencedBefore && !fencedNow || !v.hasToken && (!seen || !prev.hasToken) {
			continue
		}
		if fencedBefore && !fencedNow {
			report(v, "the fenced label went (was %q, now %q)", prev.label, v.label)
		}
		if seen && prev.hasToken && !v.hasToken {
			report(v, "the token annotation went (was %q)", prev.token)
		}
		if seen && prev.hasLock && prev.lock != "" && prev.lock != v.lock {
			report(v, "the lock annotation changed from %q to %q", prev.lock, v.lock)
		}
		if !v.hasToken {
			continue
		}
		token, ok := policyToken(v.token)
		if !ok {
			report(v, "its token %q is not one the policy reads", v.token)
			continue
		}
		if seen && prev.hasToken {
			if old, ok := policyToken(prev.token); ok && token < old {
				report(v, "its token went down from %d to %d", old, token)
			}
		}
		if v.lock != run.name {
			continue // a lock that does not exist: nothing checks it (docs/annotations.md)
		}
		if floor := statusTokenBy(v.at.Add(-time.Second)); token < floor {
			report(v, "its token %d is below the lock's recorded token %d of a second before", token, floor)
		}
		if ceiling := leaseTokenBy(v.at.Add(time.Second)); token > ceiling {
			report(v, "its token %d is above every token the Lease had granted a second later (%d)", token, ceiling)
		}
	}
}

// fencedReport summarizes the fenced surface: the honest writes, and the
// objects' tokens at the end beside the Lease's.
func (run *adversaryRun) fencedReport(f *fencedSurface, cms []configMapVersion) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	final := map[string]string{}
	for _, v := range cms {
		if v.deleted {
			delete(final, v.name)
		} else if v.hasToken {
			final[v.name] = v.token
		}
	}
	var l int64
	if len(run.versions) > 0 {
		l = lease.Token(&run.versions[len(run.versions)-1])
	}
	return fmt.Sprintf("honest ledger writes: %d (%d first refused as never granted and retried, %d refused while the grant was live); "+
		"the ledger's token at the end %s, the Lease's %d; %d fenced objects of the adversary's", f.honestWrites, f.honestRetried, f.honestRefused,
		final[fencedLedger], l, len(f.own))
}
