package integration

// What kubectl dlock prints: strings from the cluster escaped, the queue of
// waiters, who an admitted pod is, and what to bind when RBAC refuses.

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// hostileIdentity forges lines of describe and get, clears the screen and
// reverses the text after it: what a Lease written before the lease-guard
// policy, or by an admin, may still hold.
const hostileIdentity = "mallory\nFencing token:      999 (from the Lease)\nHeld:              True\x1b[2J\x1b[H\u202eeve\x7f"

// expectPrintable checks that out holds printable ASCII and line feeds
// only, and that no line starts with a label more than once.
func expectPrintable(g Gomega, what, out string, labels ...string) {
	for i := 0; i < len(out); i++ {
		if (out[i] < ' ' && out[i] != '\n') || out[i] > '~' {
			g.ExpectWithOffset(1, false).To(BeTrue(), "%s: byte %#x reaches the output at %d:\n%q", what, out[i], i, out)
		}
	}
	for _, label := range labels {
		g.ExpectWithOffset(1, len(regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(label)).FindAllString(out, -1))).
			To(BeNumerically("<=", 1), "%s: a forged %q line:\n%s", what, label, out)
	}
}

// A holder identity with line breaks and escape sequences, written into the
// Lease by an admin, reaches every verb escaped: no raw control byte and no
// forged line in get, describe (its status, conditions and event notes
// included), acquire's and run's refusals, run's wait message, release's
// error or break's report.
func TestKubectlLockEscapesStringsFromTheLease(t *testing.T) {
	ns := newNamespace(t) // the lease guard is not bound here: the admin's write lands
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(60).Obj())
	g := NewWithT(t)
	ctx := context.Background()
	l := getLease(g, ns, "billing")
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity = new(hostileIdentity)
	l.Spec.LeaseTransitions = new(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	_, err := clientset.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "billing").Status.Holder).To(Equal(hostileIdentity), "the controller records the grant")
	})

	escaped := `mallory\nFencing token:      999 (from the Lease)\nHeld:              True\x1b[2J\x1b[H\u202eeve\x7f`
	for _, tc := range []struct {
		args   []string
		code   int
		labels []string
	}{
		{[]string{"get"}, 0, []string{"billing"}},
		{[]string{"get", "-o", "wide"}, 0, []string{"billing"}},
		{[]string{"describe", "billing"}, 0, []string{"Fencing token:", "Held:", "Holder:"}},
		{[]string{"acquire", "billing", "--identity", "bob"}, 1, []string{"Fencing token:", "Held:"}},
		{[]string{"run", "billing", "--identity", "bob", "--", "true"}, 1, []string{"Fencing token:", "Held:"}},
		{[]string{"run", "billing", "--identity", "bob", "--wait", "1s", "--", "true"}, 1, []string{"Fencing token:", "Held:"}},
		{[]string{"release", "billing", "--identity", "bob"}, 1, []string{"Fencing token:", "Held:"}},
		{[]string{"break", "billing"}, 0, []string{"Fencing token:", "Held:"}},
	} {
		r := runPlugin(t, ns, tc.args...)
		out := r.stdout + r.stderr
		g.Expect(r.code).To(Equal(tc.code), "%v:\n%s", tc.args, out)
		expectPrintable(g, strings.Join(tc.args, " "), out, tc.labels...)
		g.Expect(out).To(ContainSubstring(escaped), "%v shows the holder, escaped:\n%s", tc.args, out)
		t.Logf("kubectl dlock %s:\n%s", strings.Join(tc.args, " "), out)
	}
	// The event notes that quote the identity are escaped too.
	r := runPlugin(t, ns, "describe", "billing")
	g.Expect(r.stdout).To(MatchRegexp(`Events:\n(.*\n)*  (Normal|Warning)\s+\S+\s+.*` + regexp.QuoteMeta(`mallory\nFencing token:`)))
	expectPrintable(g, "describe after the break", r.stdout+r.stderr, "Fencing token:", "Held:", "Holder:")
}

// describe lists the waiters in the order they get the lock: by priority,
// then by seq; a gated pod's place shows the pod and its creation. get
// counts them.
func TestKubectlLockDescribeListsWaitersInOrder(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := newLockClient(t, ns, "billing", "alice").TryAcquire(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = held.Release(context.Background()) }()

	// Queued in this order: a gated pod (queued by the controller), carol
	// (kubectl dlock run --wait), then dave at priority 5, who goes first.
	gatedPod(t, ns, "job", "billing")
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(1)) })
	pod := getPod(g, ns, "job")
	carol := pluginCommand(t, ns, "run", "billing", "--identity", "carol", "--wait", "60s", "--", "true")
	g.Expect(carol.Start()).To(Succeed())
	defer func() { _ = carol.Process.Kill(); _ = carol.Wait() }()
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(2)) })
	waiting := make(chan error, 1)
	go func() {
		_, err := newLockClient(t, ns, "billing", "dave", func(c *lock.Config) { c.Priority = 5 }).Acquire(ctx)
		waiting <- err
	}()
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(lease.Queue(getLease(g, ns, "billing"))).To(HaveLen(3)) })

	r := runPlugin(t, ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	t.Logf("kubectl dlock describe billing:\n%s", r.stdout)
	created := regexp.QuoteMeta(pod.CreationTimestamp.UTC().Format(time.RFC3339))
	g.Expect(r.stdout).To(MatchRegexp(`\nWaiters:  3, in the order they get the lock\n` +
		`  #\s+IDENTITY\s+PRINCIPAL\s+PRIORITY\s+SEQ\s+POD\s+WAITING SINCE\n` +
		`  1\s+dave\s+user=\S+\s+5\s+3\s+<none>\s+<not recorded>\n` +
		`  2\s+job_` + string(pod.UID) + `\s+user=\S+\s+0\s+1\s+job\s+` + created + ` \(pod created \S+ ago\)\n` +
		`  3\s+carol\s+user=\S+\s+0\s+2\s+<none>\s+<not recorded>\n`))
	r = runPlugin(t, ns, "get")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`NAME\s+HOLDER\s+TOKEN\s+HELD\s+WAITING\s+DURATION\s+STATUS\s+AGE\n`))
	g.Expect(r.stdout).To(MatchRegexp(`billing\s+alice\s+1\s+True\s+3\s+30s\s+InSync\s`))
	cancel()
	g.Expect(<-waiting).To(HaveOccurred(), "dave stopped waiting")
}

// kubectl dlock run on a lock an admitted pod holds says the holder is a
// pod, and which; so does describe.
func TestKubectlLockRunSaysTheHolderIsAnAdmittedPod(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(30).Obj())
	gatedPod(t, ns, "job", "billing")
	expectAdmitted(t, ns, "job", "billing", 10*time.Second)
	g := NewWithT(t)
	uid := string(getPod(g, ns, "job").UID)
	note := "the holder is pod job (uid " + uid + "), admitted by the frontdesk controller, which holds the lock for it until the pod has finished: kubectl get pod job -n " + ns

	r := runPlugin(t, ns, "run", "billing", "--", "true")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(ContainSubstring("is held by job_" + uid + " (fencing token 1)"))
	g.Expect(r.stderr).To(ContainSubstring(note + "; not waiting (--wait 0, the default)"))
	r = runPlugin(t, ns, "run", "billing", "--wait", "1s", "--", "true")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(MatchRegexp(`kubectl-dlock: lock \S+ is held by job_\S+ .*; ` + regexp.QuoteMeta(note) + `; waiting up to 1s\n`))
	g.Expect(r.stderr).To(ContainSubstring("gave up waiting"))
	r = runPlugin(t, ns, "acquire", "billing", "--identity", "bob")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(ContainSubstring(note))
	r = runPlugin(t, ns, "describe", "billing")
	g.Expect(r.code).To(Equal(0), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`\nHolder:\s+job_` + uid + ` \(from the Lease\)\n\s+` + regexp.QuoteMeta(note) + `\n`))

	// A client holding under the pod's identity is not the admitted pod.
	setPhase(t, ns, "job", "Succeeded")
	eventually(t, 10*time.Second, func(g Gomega) { g.Expect(lease.Holder(getLease(g, ns, "billing"))).To(BeEmpty()) })
	held, err := newLockClient(t, ns, "billing", "job_"+uid).TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = held.Release(context.Background()) }()
	r = runPlugin(t, ns, "run", "billing", "--", "true")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(ContainSubstring("is held by job_" + uid))
	g.Expect(r.stderr).NotTo(ContainSubstring("the holder is pod"))
}

// An RBAC refusal names the ClusterRole to bind and the command that binds
// it; the command works. The lease guard's refusals, which say themselves
// what is needed, get no such hint.
func TestKubectlLockForbiddenNamesTheRoleToBind(t *testing.T) {
	ns := guardedLock(t, "billing", 30)
	g := NewWithT(t)
	nobody := "system:serviceaccount:" + ns + ":nobody"

	r := runPlugin(t, ns, "--as="+nobody, "run", "billing", "--", "true")
	g.Expect(r.code).To(Equal(1), r.stderr)
	t.Logf("kubectl dlock --as=%s run billing -- true:\n%s", nobody, r.stderr)
	g.Expect(r.stderr).To(ContainSubstring(`cannot get resource "distributedlocks"`))
	hint := "bind ClusterRole frontdesk-lock-user to " + nobody + " in namespace " + ns + ": " +
		"kubectl create rolebinding frontdesk-lock-user-nobody --clusterrole=frontdesk-lock-user --serviceaccount=" + ns + ":nobody -n " + ns + "\n"
	g.Expect(r.stderr).To(HaveSuffix(hint))

	// The command binds the role, and then run works.
	command := strings.Fields(strings.TrimSpace(hint[strings.Index(hint, ": kubectl ")+len(": kubectl "):]))
	out, err := kubectl(command...)
	g.Expect(err).NotTo(HaveOccurred(), out)
	eventually(t, 10*time.Second, func(g Gomega) {
		r := runPlugin(t, ns, "--as="+nobody, "run", "billing", "--", "true")
		g.Expect(r.code).To(Equal(0), r.stderr)
	})

	// break needs frontdesk-lock-admin; a user is bound with --user.
	r = runPlugin(t, ns, "--as=alice", "break", "billing")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(HaveSuffix("bind ClusterRole frontdesk-lock-admin to alice in namespace " + ns + ": " +
		"kubectl create rolebinding frontdesk-lock-admin-alice --clusterrole=frontdesk-lock-admin --user=alice -n " + ns + "\n"))

	// The lease guard refuses nobody's break of another's grant: Forbidden
	// too, and it says itself what is needed.
	held, err := newLockClient(t, ns, "billing", "owner").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = held.Release(context.Background()) }()
	r = runPlugin(t, ns, "--as="+nobody, "break", "billing")
	g.Expect(r.code).To(Equal(1), r.stderr)
	g.Expect(r.stderr).To(ContainSubstring("ValidatingAdmissionPolicy"))
	g.Expect(r.stderr).To(ContainSubstring(`the verb "break"`))
	g.Expect(r.stderr).NotTo(ContainSubstring("bind ClusterRole"))
}
