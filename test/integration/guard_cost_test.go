package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/test/guardcost"
)

// costParticipant is a pod's client whose requests carry a token bound to
// it, and who the apiserver says it is.
type costParticipant struct {
	leases    func(ns string) leaseClient
	user      user.Info
	principal string
}

type leaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*coordinationv1.Lease, error)
}

// longestParticipants are pods of ServiceAccounts whose usernames are as
// long as Kubernetes allows (a namespace of 63 characters, names of 253:
// 339 characters, the grammar's 340 but one), users pods each, bound to
// frontdesk-lock-user, with real pod-bound tokens.
func longestParticipants(t *testing.T, ns string, users, pods int) [][]costParticipant {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	out := make([][]costParticipant, users)
	for u := range users {
		prefix := fmt.Sprintf("sa-%d-", u)
		sa := prefix + strings.Repeat("s", 253-len(prefix))
		g.Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}})).To(Succeed())
		g.Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sa-%d-lock-user", u), Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "frontdesk-lock-user"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
		})).To(Succeed())
		for i := range pods {
			pod, err := clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d-%d", u, i)},
				Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
					Containers: []corev1.Container{{Name: "main", Image: "frontdesk.invalid/participant:never-pulled"}}},
			}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
				ExpirationSeconds: new(int64(3600)),
				BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
			}}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			cfg := rest.AnonymousClientConfig(restConfig())
			cfg.BearerToken, cfg.QPS = tr.Status.Token, -1
			cs := kubernetes.NewForConfigOrDie(cfg)
			review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			ui := review.Status.UserInfo
			extra := map[string][]string{}
			for k, v := range ui.Extra {
				extra[k] = v
			}
			p := costParticipant{leases: func(ns string) leaseClient { return cs.CoordinationV1().Leases(ns) },
				user: &user.DefaultInfo{Name: ui.Username, UID: ui.UID, Groups: ui.Groups, Extra: extra}, principal: lease.Principal(ui.Username, extra)}
			g.Expect(ui.Username).To(HaveLen(339))
			g.Expect(lease.ValidPrincipal(p.principal)).To(BeTrue(), p.principal)
			out[u] = append(out[u], p)
		}
	}
	eventually(t, 10*time.Second, func(g Gomega) { // RBAC caches catch up with the new bindings
		_, err := out[users-1][pods-1].leases(ns).Get(ctx, "worst", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	})
	return out
}

// The worst Lease the guard's rules allow, built through the apiserver with
// config/default's policies in force: MaxPlaces places, each of the longest
// values of the grammar (tickets of 40 characters, the lowest priority,
// seqs of 15 digits, identities of 253 characters, principals of pods of
// ServiceAccounts with the longest usernames Kubernetes allows), registered
// by participants with real pod-bound tokens (16 pods of 4 ServiceAccounts:
// the bounds per principal and per user), held by one of them. Every write
// a participant makes on it is judged in full (one refused at the bound,
// a hand-off out of order refused), and the honest ones are admitted.
//
// Each write the apiserver admitted is then judged again in process, by the
// same policy compiled with the apiserver's CEL libraries (test/guardcost)
// with a quarter of each runtime limit: every program (variable,
// validation, message expression) within PerCallLimit/4, the call (the
// validations and the variables they evaluate, then the message
// expressions from what remains) within RuntimeCELCostBudget/4, the match
// conditions within RuntimeCELCostBudgetMatchConditions; the costs are
// logged (go test -v). The apiserver enforces only runtime costs on a
// ValidatingAdmissionPolicy (its object is dynamically typed: there is no
// static estimate to refuse it for): these are the limits that bind.
func TestWorstLeaseTheGuardAllowsFitsAQuarterOfItsCELBudgets(t *testing.T) {
	deployDefault(t)
	ctx := context.Background()
	g := NewWithT(t)
	nsPrefix := "worst-"
	ns := nsPrefix + strings.Repeat("n", 63-len(nsPrefix)-5) + fmt.Sprintf("%05d", time.Now().UnixNano()%100000)
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{leaseGuardNamespaceLabel: "on"}}})).
		To(Succeed())
	guardedLockIn(t, ns, "worst", 3600)
	parts := longestParticipants(t, ns, lease.MaxPlaces/lease.MaxPlacesPerUser, lease.MaxPlacesPerUser/lease.MaxPlacesPerPrincipal)
	holder := parts[0][0]
	policy, err := guardcost.LoadPolicy("lease-guard")
	g.Expect(err).NotTo(HaveOccurred())
	quarter, err := guardcost.Compile(policy, celconfig.PerCallLimit/4)
	g.Expect(err).NotTo(HaveOccurred())

	// write sends p's patch, expects the apiserver's answer, and judges an
	// admitted write again in process with a quarter of the budgets.
	var worst guardcost.Result
	write := func(what string, p costParticipant, pt types.PatchType, patch []byte, wantErr string) *coordinationv1.Lease {
		t.Helper()
		old := getLease(g, ns, "worst")
		updated, err := p.leases(ns).Patch(ctx, "worst", pt, patch, metav1.PatchOptions{})
		if wantErr != "" {
			refused(g, err, wantErr)
			return old
		}
		g.Expect(err).NotTo(HaveOccurred(), what)
		r, err := quarter.Evaluate(ctx, guardcost.Write{Old: old, New: updated, User: p.user}, celconfig.RuntimeCELCostBudget/4)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Matched).To(Equal(what != "renewal"), "%s: a renewal by its holder is not judged (matchConditions), the rest are", what)
		g.Expect(r.Admitted()).To(BeTrue(), "%s with a quarter of the budgets: refused by %v, errors %v", what, r.Denied, r.Errors)
		g.Expect(r.MessageErrors).To(BeEmpty(), what)
		if len(lease.Queue(old)) >= lease.MaxPlaces-1 {
			t.Logf("%-40s validations %7d + messages %6d of the call's %d; match conditions %d of %d", what, r.CallCost, r.MessageCost,
				celconfig.RuntimeCELCostBudget, r.MatchCost, celconfig.RuntimeCELCostBudgetMatchConditions)
			if r.CallCost+r.MessageCost > worst.CallCost+worst.MessageCost {
				worst = r
			}
		}
		return updated
	}
	register := func(p costParticipant, ticket, identity string) {
		t.Helper()
		reg, _, err := lease.ExactRegistration(getLease(g, ns, "worst"),
			lease.Waiter{Ticket: ticket, Identity: identity, Priority: lease.MinPriority, Principal: p.principal})
		g.Expect(err).NotTo(HaveOccurred())
		write("registration of "+ticket[:10], p, types.JSONPatchType, reg.Bytes(), "")
	}

	// The holder takes the lock.
	gp, err := lease.GrantPatch(getLease(g, ns, "worst"), guardcost.WorstIdentity("holder", 0), holder.principal, "", "n-1", time.Hour, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	write("grant", holder, types.JSONPatchType, gp.Bytes(), "")
	// The first place comes from the manager's side (a cluster admin; the
	// guard lets it write anything): seqs of 15 digits from then on, and a
	// principal of the grammar's longest username (340 characters).
	seeded := getLease(g, ns, "worst")
	seeded.Annotations[lease.EntryKey(guardcost.WorstTicket("seed", 0))] = fmt.Sprintf("%d,%d,%s", lease.MinPriority, int64(guardcost.WorstSeqBase),
		guardcost.WorstIdentity("seed", 0))
	seeded.Annotations[lease.QueuedByKey(guardcost.WorstTicket("seed", 0))] = guardcost.WorstPrincipal(9, 9)
	g.Expect(k8sClient.Update(ctx, seeded)).To(Succeed())
	// The others register, 16 places a pod, up to MaxPlaces.
	n := 1
	for _, user := range parts {
		for _, p := range user {
			for range lease.MaxPlacesPerPrincipal {
				if n == lease.MaxPlaces {
					break
				}
				register(p, guardcost.WorstTicket("place", n), guardcost.WorstIdentity("waiter", n))
				n++
			}
		}
	}
	full := getLease(g, ns, "worst")
	g.Expect(lease.Queue(full)).To(HaveLen(lease.MaxPlaces))
	size := 0
	for k, v := range full.Annotations {
		size += len(k) + len(v)
	}
	t.Logf("the worst Lease: %d places, %d bytes of annotations", len(lease.Queue(full)), size)

	// On it: a renewal; a place more is refused; one leaves and another
	// takes the last place; a hand-off out of order is refused; the
	// hand-off to the head.
	last := parts[3][3]
	write("renewal", holder, types.JSONPatchType, lease.RenewPatch(full, time.Now()).Bytes(), "")
	// (The library does not try: it finds the queue full. Written by hand.)
	extra, maxSeq := &lease.Patch{}, int64(0)
	for _, w := range lease.Queue(full) {
		maxSeq = max(maxSeq, w.Seq)
	}
	extra.Set(lease.AnnotationPath(lease.EntryKey(guardcost.WorstTicket("extra", 0))),
		fmt.Sprintf("%d,%d,%s", lease.MinPriority, maxSeq+1, guardcost.WorstIdentity("extra", 0)))
	extra.Set(lease.AnnotationPath(lease.QueuedByKey(guardcost.WorstTicket("extra", 0))), parts[3][2].principal)
	write("a place more", parts[3][2], types.JSONPatchType, extra.Bytes(), "holds at most 256 places")
	wd, err := lease.Withdrawal(guardcost.WorstTicket("place", lease.MaxPlaces-1))
	g.Expect(err).NotTo(HaveOccurred())
	write("withdrawal", last, types.MergePatchType, wd, "")
	register(last, guardcost.WorstTicket("again", 0), guardcost.WorstIdentity("again", 0))
	current := getLease(g, ns, "worst")
	g.Expect(lease.Queue(current)).To(HaveLen(lease.MaxPlaces))
	ho, head, ok, err := lease.HandOffPatch(current, guardcost.WorstIdentity("holder", 0), time.Hour, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue())
	g.Expect(head.Ticket).To(Equal(guardcost.WorstTicket("seed", 0)))
	// Out of order: to the second place, as if the head were not there.
	skip := current.DeepCopy()
	delete(skip.Annotations, lease.EntryKey(head.Ticket))
	delete(skip.Annotations, lease.QueuedByKey(head.Ticket))
	delete(skip.Labels, locksv1alpha1.FrontLabelPrefix+head.Ticket)
	bad, _, _, err := lease.HandOffPatch(skip, guardcost.WorstIdentity("holder", 0), time.Hour, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	write("hand-off out of order", holder, types.JSONPatchType, bad.Bytes(), lease.StaleQueueRefusal)
	write("hand-off", holder, types.JSONPatchType, ho.Bytes(), "")
	t.Logf("costliest write: validations %d + messages %d: %.0fx below the per-call budget %d",
		worst.CallCost, worst.MessageCost, float64(celconfig.RuntimeCELCostBudget)/float64(worst.CallCost+worst.MessageCost), celconfig.RuntimeCELCostBudget)
}
