package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/frontdesk-dev/frontdesk/pkg/lease"
)

// A step that wrote the Lease and then failed further on (the admitted
// pod's grant ends and the lock goes to the next pod's place; the next
// pod's ungating is refused) still has its write followed: the pass's
// status comes from the Lease as written, and the write's event
// (PodReleased) is recorded (design.md, "One pass").
func TestWriteThenFailingStepKeepsItsEvent(t *testing.T) {
	ns, _, token := admittedRunningPod(t, 30)
	g := NewWithT(t)
	unrefuse := refuse(t, "no-next-update-"+ns, admissionregistrationv1.Update,
		admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		"!(object.metadata.namespace == '"+ns+"' && object.metadata.name == 'next')",
		func(ctx context.Context) error {
			p := getPod(g, ns, "next")
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations["probe"] = "x"
			return k8sClient.Update(ctx, p, client.DryRunAll)
		})
	setPhase(t, ns, "first", corev1.PodFailed) // proven finished: its grant ends at once
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(lease.Token(getLease(g, ns, "billing"))).To(Equal(token+1), "the lock was handed to next's place")
		g.Expect(eventReasons(g, ns, "billing")).To(ContainElement("PodReleased"), "the hand-off's event, while next's ungating fails")
		g.Expect(getLock(g, ns, "billing").Status.FencingToken).To(Equal(token+1), "the status of the Lease as written")
	})
	expectGated(g, ns, "next", "billing")
	unrefuse()
	g.Expect(expectAdmitted(t, ns, "next", "billing", 15*time.Second)).To(Equal(token + 1))
}
