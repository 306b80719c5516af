//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestLeaderNodeLoss: in candidates mode the controller elects a Ready pod;
// when the holder's whole node is frozen (`docker pause` of the kind node
// container: kubelet, runtime and pods stop together) the node goes
// NotReady, its pods stop being Ready, and the controller hands the lock to
// the pod on the other worker with a higher fencing token, never marking two
// pods as holder at the same time (every pod update is watched).
//
// It freezes a node, so it runs last (files run in name order).
func TestLeaderNodeLoss(t *testing.T) {
	c := start(t, "nodeloss")
	g := NewWithT(t)

	overlaps := c.watchHolderMarks(webHolderLabel)
	c.applyFile("web.yaml")
	c.waitRollout("web", 3*time.Minute)
	first, firstToken := c.webHolder(g)
	pod, err := c.cs.CoreV1().Pods(c.ns).Get(c.ctx, first, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	node := pod.Spec.NodeName
	c.stepf("holder %s on node %s, token %d", first, node, firstToken)

	c.stepf("docker pause %s", node)
	lost := time.Now()
	if out, err := exec.Command("docker", "pause", node).CombinedOutput(); err != nil {
		t.Fatalf("docker pause %s: %v: %s", node, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("docker", "unpause", node).CombinedOutput(); err != nil {
			t.Logf("docker unpause %s: %v: %s", node, err, out)
		}
	})

	var second string
	var secondToken int64
	g.Eventually(func(g Gomega) {
		l, err := c.lock("web-leader")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Status.HolderPod).NotTo(Or(BeEmpty(), Equal(first)))
		g.Expect(l.Status.FencingToken).To(BeNumerically(">", firstToken))
		second, secondToken = l.Status.HolderPod, l.Status.FencingToken
	}).WithTimeout(4*time.Minute).WithPolling(time.Second).Should(Succeed(), "a new leader after node %s is lost", node)
	c.stepf("new holder %s, token %d, %s after the node was frozen", second, secondToken, time.Since(lost).Round(time.Second))

	n, err := c.cs.CoreV1().Nodes().Get(c.ctx, node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			g.Expect(cond.Status).NotTo(Equal(corev1.ConditionTrue), "node %s is no longer Ready", node)
		}
	}
	newPod, err := c.cs.CoreV1().Pods(c.ns).Get(c.ctx, second, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(newPod.Spec.NodeName).NotTo(Equal(node), "the new leader runs on another node")
	g.Expect(isReady(newPod)).To(BeTrue(), "the new leader is Ready")
	g.Eventually(func(g Gomega) {
		old, err := c.cs.CoreV1().Pods(c.ns).Get(c.ctx, first, metav1.GetOptions{})
		if err == nil {
			g.Expect(old.Labels).NotTo(HaveKey(webHolderLabel), "the lost pod's holder label is removed")
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	if o := overlaps(); len(o) > 0 {
		t.Errorf("two pods marked as holder at once: %s", strings.Join(o, "; "))
	}
}

// watchHolderMarks watches every pod update in the test's namespace and
// returns a function listing each moment when more than one pod carried the
// holder label.
func (t *tc) watchHolderMarks(label string) func() []string {
	t.Helper()
	w, err := t.cs.CoreV1().Pods(t.ns).Watch(t.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watching pods: %v", err)
	}
	var mu sync.Mutex
	var overlaps []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		marked := map[string]bool{}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			marked[p.Name] = ev.Type != watch.Deleted && p.Labels[label] == "true"
			var names []string
			for n, m := range marked {
				if m {
					names = append(names, n)
				}
			}
			if len(names) > 1 {
				slices.Sort(names)
				mu.Lock()
				overlaps = append(overlaps, fmt.Sprintf("%s at resourceVersion %s", strings.Join(names, " and "), p.ResourceVersion))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-done:
			t.Errorf("the pod watch ended early: some updates were not seen")
		default:
		}
		return append([]string(nil), overlaps...)
	}
}
