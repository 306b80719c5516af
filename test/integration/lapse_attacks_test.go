package integration

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/testutil"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
	"github.com/frontdesk-dev/frontdesk/pkg/lock"
)

// syncBuffer is a bytes.Buffer safe to write from a process's output
// copier while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// plugin is a kubectl dlock process started by a test.
type plugin struct {
	cmd         *exec.Cmd
	out, errOut *syncBuffer
	// exited is closed when the process has exited, with its error in err.
	exited chan struct{}
	err    error
}

// startPlugin starts kubectl dlock with args in ns, its output captured.
func startPlugin(t *testing.T, ns string, args ...string) *plugin {
	t.Helper()
	p := &plugin{cmd: pluginCommand(t, ns, args...), out: &syncBuffer{}, errOut: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.errOut
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// waitLapseMark waits until the controller marks the grant with token
// lapsed, and returns the Lease as marked.
func waitLapseMark(t *testing.T, ns, name string, token int64) {
	t.Helper()
	eventually(t, 15*time.Second, func(g Gomega) {
		l := getLease(g, ns, name)
		g.Expect(lease.Token(l)).To(Equal(token))
		g.Expect(l.Annotations[locksv1alpha1.LapsedAnnotation]).To(Equal(strconv.FormatInt(token, 10)))
	})
}

// freezeHeadThroughALapsedHandOff queues waiter (a kubectl dlock run with
// args) behind holder's grant, freezes it with SIGSTOP, has the holder
// release (the release hands the lock to the frozen waiter), waits until
// the controller marks that handed-off grant lapsed, and thaws the waiter.
// It returns the handed-off token and the waiter's output.
func freezeHeadThroughALapsedHandOff(t *testing.T, ns string, holder *lock.Grant, args ...string) (int64, *plugin) {
	t.Helper()
	g := NewWithT(t)
	w := startPlugin(t, ns, args...)
	queuedTicket(t, ns, "billing", "w")
	g.Expect(w.cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())
	handed := holder.Token() + 1
	g.Expect(holder.Release(context.Background())).To(Succeed())
	l := getLease(g, ns, "billing")
	g.Expect(lease.Holder(l)).To(Equal("w"), "the release handed the lock to the frozen head")
	g.Expect(lease.Token(l)).To(Equal(handed))
	waitLapseMark(t, ns, "billing", handed)
	g.Expect(w.cmd.Process.Signal(syscall.SIGCONT)).To(Succeed())
	return handed, w
}

// Promise: a holder stops acting before anyone else can take over. A head
// of the queue that was frozen through the hand-off of the lock to it and
// the controller's lapse mark on that grant renews the handed-off grant
// when it thaws (claimHandOff: the renewal patch tests holder and token,
// not the mark), and, without the lease policy to refuse that renewal,
// it lands: the head acts on a fresh window while the Lease still says
// the grant lapsed, and anyone may take the lock over at once.
func TestLapsedHandOffIsNotRenewedBack(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	h, err := lock.New(restConfig(), lock.Config{Namespace: ns, Name: "billing", Identity: "h"})
	g.Expect(err).NotTo(HaveOccurred())
	gh, err := h.TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	handed, w := freezeHeadThroughALapsedHandOff(t, ns, gh,
		"run", "billing", "--identity", "w", "--wait", "60s", "--", "sh", "-c", "echo started $FENCING_TOKEN; sleep 30")
	thawed := time.Now()

	var renewed time.Time
	deadline := time.Now().Add(10 * time.Second)
	for renewed.IsZero() && time.Now().Before(deadline) {
		l := getLease(g, ns, "billing")
		if lease.Holder(l) == "w" && lease.Token(l) == handed && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(thawed.Add(-time.Second)) {
			renewed = time.Now()
			g.Expect(lease.Lapsed(l)).To(BeTrue(), "the renewal left the lapse mark in place")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if renewed.IsZero() {
		t.Logf("the thawed head did not renew the lapsed hand-off (stdout %q, stderr %q)", w.out.String(), w.errOut.String())
		return
	}
	t.Errorf("BROKEN: the thawed head renewed its handed-off grant (fencing token %d) after the controller had marked it lapsed", handed)
	eventually(t, 5*time.Second, func(g Gomega) { g.Expect(w.out.String()).To(ContainSubstring("started")) })

	x, err := lock.New(restConfig(), lock.Config{Namespace: ns, Name: "billing", Identity: "x"})
	g.Expect(err).NotTo(HaveOccurred())
	gx, err := x.TryAcquire(context.Background())
	if err == nil {
		t.Errorf("BROKEN: x took the lock over (fencing token %d) %s after the head renewed and started acting on token %d, "+
			"inside the head's new window (lease 2 s)", gx.Token(), time.Since(renewed).Round(time.Millisecond), handed)
		_ = gx.Release(context.Background())
	} else {
		g.Expect(err).To(MatchError(lock.ErrHeld))
	}
}

// Promise (liveness): a waiter that waited its turn gets the lock. Under
// the lease policy, the same thawed head's renewal of the lapsed hand-off
// is refused, and its Acquire gives up with that refusal instead of
// taking the lock, which is free to anyone, anew.
func TestLapsedHandOffIsTakenAnewUnderThePolicy(t *testing.T) {
	ns := guardedLock(t, "billing", 2)
	alice := newParticipant(t, ns, "alice", "")
	newParticipant(t, ns, "bob", "")
	g := NewWithT(t)
	ga, err := alice.lockClient(t, ns, "billing", "alice-1").TryAcquire(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	handed, w := freezeHeadThroughALapsedHandOff(t, ns, ga, "--as", "system:serviceaccount:"+ns+":bob",
		"run", "billing", "--identity", "w", "--wait", "60s", "--", "sh", "-c", "echo started $FENCING_TOKEN; sleep 30")

	select {
	case <-w.exited:
		t.Errorf("BROKEN: the thawed head gave up (%v) instead of taking the free lock after its handed-off grant (token %d) lapsed; "+
			"stdout %q, stderr %q", w.err, handed, w.out.String(), w.errOut.String())
	case <-waitFor(func() bool { return strings.Contains(w.out.String(), "started") }, 10*time.Second):
	case <-time.After(11 * time.Second):
		t.Errorf("the thawed head neither took the lock nor gave up in 10 s: stdout %q, stderr %q", w.out.String(), w.errOut.String())
	}
}

// Promise (liveness): a place whose client is gone leaves the queue when
// its turn passes. A waiter killed while queued leaves its place; when the
// lock falls free other than by a hand-off and nobody else wants it, the
// next process under that identity (a retried job: kubectl dlock run
// --identity) is refused with ErrIdentityInUse for good: the dead place is
// at the head, and only another's takeover would remove it.
func TestDeadPlaceDoesNotLockItsIdentityOutForGood(t *testing.T) {
	ns := newNamespace(t)
	createReadyLock(t, testutil.MakeLock("billing", ns).LeaseDuration(2).Obj())
	g := NewWithT(t)
	holder := startPlugin(t, ns, "run", "billing", "--identity", "h", "--", "sleep", "60")
	var token int64
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(lease.Holder(l)).To(Equal("h"))
		token = lease.Token(l)
	})
	waiter := startPlugin(t, ns, "run", "billing", "--identity", "me", "--wait", "60s", "--", "true")
	queuedTicket(t, ns, "billing", "me")
	g.Expect(waiter.cmd.Process.Kill()).To(Succeed())
	g.Expect(holder.cmd.Process.Kill()).To(Succeed())
	waitLapseMark(t, ns, "billing", token)

	me, err := lock.New(restConfig(), lock.Config{Namespace: ns, Name: "billing", Identity: "me"})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gm, err := me.Acquire(ctx)
	if errors.Is(err, lock.ErrIdentityInUse) {
		t.Fatalf("BROKEN: the retried job cannot take the free lock under its identity: %v", err)
	}
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gm.Release(context.Background())).To(Succeed())
}

// waitFor is closed once cond holds, polled every 20ms, or never if it
// does not within timeout.
func waitFor(cond func() bool, timeout time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if cond() {
				close(done)
				return
			}
		}
	}()
	return done
}
