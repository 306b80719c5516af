package integration

// Failover on proof for every kind of holder besides pkg/lock clients
// (failover_proof_test.go): pkg/leaderelection, stock client-go leader
// election on a lock's Lease, and `kubectl dlock run` in a pod. Each holds
// with a real token bound to its pod, at a 15 s lease, and renews no more;
// its pod is then written Failed with its container terminated, as its
// kubelet would write it, and the next holder, of another pod, must hold
// within proofBound, with the next fencing token.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	fencedelection "github.com/frontdesk-dev/frontdesk/pkg/leaderelection"
	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A leader whose pod is proven dead is succeeded at once: two electors,
// pods of one ServiceAccount (as a Deployment's replicas are), each with
// its pod's token and the lock's LeaseDuration (15 s). The leader stops
// renewing without releasing (as a dead process would); the other elector
// keeps retrying and does not lead while the lease runs; once the leader's
// pod is Failed with its container terminated, the other leads within
// proofBound, with the next token. client-go's own LeaseLock carries a
// principal (and so a pod) only where config/mutating's lease-principal
// policy writes it; without MutatingAdmissionPolicy its grants are refused
// (TestStockClientGoElectorsOfTwoServiceAccountsTakeTurns) and there is
// nothing to fail over.
func TestProvenDeadLeaderFailsOverAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stock bool
	}{{"pkg/leaderelection", false}, {"client-go LeaseLock", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.stock && !servesMutatingPolicies() {
				t.Skip("the apiserver serves no MutatingAdmissionPolicy: a stock elector's grant carries no principal")
			}
			electorFailsOverOnProof(t, tc.stock)
		})
	}
}

// electorFailsOverOnProof is TestProvenDeadLeaderFailsOverAtOnce for one
// kind of elector (electorResourceLock).
func electorFailsOverOnProof(t *testing.T, stock bool) {
	ns := guardedLock(t, "billing", int32(proofLease/time.Second))
	a := newPodParticipant(t, ns, "operator", "operator-0")
	b := newPodParticipant(t, ns, "operator", "operator-1")
	g := NewWithT(t)
	leaders := make(chan string, 8)
	stopA := runProofElector(t, electorResourceLock(t, ns, a, stock), leaders, a.name)
	g.Eventually(leaders).WithTimeout(5 * time.Second).Should(Receive(Equal(a.name)))
	first := getLease(g, ns, "billing")
	g.Expect(first.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(a.principal), "the leader's grant names its pod")
	stopA() // no ReleaseOnCancel: a renews no more, as a dead process would not

	lkB := electorResourceLock(t, ns, b, stock)
	runProofElector(t, lkB, leaders, b.name)
	g.Consistently(leaders).WithTimeout(time.Second).ShouldNot(Receive(), "b led while a's lease ran")

	died := time.Now()
	writePodStatus(t, a.pod, corev1.PodFailed, killed)
	leader, took, ok := provenTakeover(leaders, died)
	if !ok {
		t.Fatalf("b did not lead within %s of the leader's proven death (lease %s)", proofBound, proofLease)
	}
	t.Logf("proof to the next leader: %s (lease %s)", took.Round(time.Millisecond), proofLease)
	g.Expect(leader).To(Equal(b.name))
	taken := getLease(g, ns, "billing")
	g.Expect(lease.Token(taken)).To(Equal(lease.Token(first)+1), "the next leader's fencing token")
	g.Expect(taken.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(b.principal))
	if fenced, ok := lkB.(*fencedelection.Lock); ok {
		g.Expect(fenced.Term()).NotTo(BeNil(), "b leads without a Term")
		g.Expect(fenced.Term().Token()).To(Equal(lease.Token(first)+1), "b's Term token")
	}
	expectProvenDead(t, ns, "billing")
}

// runProofElector runs an elector on lk at the lock's LeaseDuration (proofLease)
// until the test ends or the returned stop is called; stop returns once
// the elector has stopped.
func runProofElector(t *testing.T, lk resourcelock.Interface, leaders chan<- string, name string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runLeaderFor(ctx, t, lk, proofLease, leaders, name)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// `kubectl dlock run` in a pod, with its pod's token, holds a lock (15 s
// lease) and is frozen (SIGSTOP: it neither renews nor releases). Once its
// pod is Failed with its container terminated, the next waiter, of another
// pod, holds within proofBound with the next token. The frozen run, let go
// on, finds its grant gone and exits 75 (lease lost).
func TestProvenDeadKubectlLockRunFailsOverAtOnce(t *testing.T) {
	ns := guardedLock(t, "billing", int32(proofLease/time.Second))
	holder := podParticipant(t, ns, "app", "runner")
	g := NewWithT(t)
	run := podLockRun(t, holder.pod, "billing", "sleep", "60")
	var held int64
	eventually(t, 10*time.Second, func(g Gomega) {
		l := getLease(g, ns, "billing")
		g.Expect(lease.Holder(l)).To(HavePrefix(holder.pod.Name+"_"), "the run's identity names its pod: %s", run.out.String())
		g.Expect(l.Annotations[locksv1alpha1.HolderPrincipalAnnotation]).To(Equal(holder.principal))
		held = lease.Token(l)
	})
	next := nextWaiter(t, podParticipant(t, ns, "app", "waiter"), "billing")
	g.Expect(run.cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())

	died := time.Now()
	writePodStatus(t, holder.pod, corev1.PodFailed, killed)
	gr, took, ok := provenTakeover(next, died)
	if !ok || gr == nil {
		t.Fatalf("the waiter did not hold within %s of the run's pod's proven death (lease %s)", proofBound, proofLease)
	}
	t.Logf("proof to the next holder's grant: %s (lease %s)", took.Round(time.Millisecond), proofLease)
	g.Expect(gr.Token()).To(Equal(held+1), "the next grant's fencing token")
	expectProvenDead(t, ns, "billing")

	g.Expect(run.cmd.Process.Signal(syscall.SIGCONT)).To(Succeed())
	g.Eventually(run.exited).WithTimeout(10*time.Second).Should(Receive(Equal(75)), "the resumed run: %s", run.out.String())
}

// provenTakeover waits until proofBound after since for the next holder on next,
// and returns it, how long after since it came, and whether it came.
func provenTakeover[T any](next <-chan T, since time.Time) (v T, took time.Duration, ok bool) {
	select {
	case v = <-next:
		return v, time.Since(since), true
	case <-time.After(time.Until(since.Add(proofBound))):
		return v, time.Since(since), false
	}
}

// expectProvenDead expects the lock's events to say its holder was proven
// dead, and not that its grant lapsed.
func expectProvenDead(t *testing.T, ns, lockName string) {
	t.Helper()
	eventually(t, 3*time.Second, func(g Gomega) {
		reasons := eventReasons(g, ns, lockName)
		g.Expect(reasons).To(ContainElement(EventHolderProvenDead))
		g.Expect(reasons).NotTo(ContainElement("Expired"), "a proven death is not reported as a lapse")
	})
}

// lockRun is a `kubectl dlock run` started in the background.
type lockRun struct {
	cmd *exec.Cmd
	out *capturedOutput
	// exited receives its exit status (-1 if a signal ended it).
	exited <-chan int
}

// podLockRun starts `kubectl dlock run lockName -- command...` as a process
// of pod would run it: with a kubeconfig holding a token bound to the pod
// (podTokenConfig), and $POD_NAME and $POD_UID set as the downward API
// sets them. It is killed, stopped or not, when the test ends.
func podLockRun(t *testing.T, pod *corev1.Pod, lockName string, command ...string) lockRun {
	t.Helper()
	args := append([]string{"--kubeconfig", writeKubeconfig(t, podTokenConfig(t, pod)), "-n", pod.Namespace, "run", lockName, "--"}, command...)
	cmd := exec.Command(kubectlLock(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOCK_IDENTITY=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "POD_NAME="+pod.Name, "POD_UID="+string(pod.UID))
	out := outputFile(t)
	cmd.Stdout, cmd.Stderr = out.f, out.f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kubectl dlock run: %v", err)
	}
	exited, done := make(chan int, 1), make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
		exited <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
		<-done
	})
	return lockRun{cmd: cmd, out: out, exited: exited}
}

// writeKubeconfig writes a kubeconfig for rc's server, CA and bearer token
// and returns its path.
func writeKubeconfig(t *testing.T, rc *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData,
		CertificateAuthority: rc.CAFile, TLSServerName: rc.ServerName}
	kc.AuthInfos["pod"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	kc.Contexts["pod"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "pod"}
	kc.CurrentContext = "pod"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("writing a kubeconfig: %v", err)
	}
	return path
}
