//go:build e2e

package e2e

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const managerSelector = "app.kubernetes.io/name=frontdesk,app.kubernetes.io/component=controller-manager"

// TestDeployDefault checks config/default as TestMain deployed it: two
// manager replicas Ready (readiness probe) and not restarted (liveness
// probe), one of them the elected leader, /metrics served only to an
// identity bound to the metrics-reader role, and the manager's RBAC as
// shipped: what it needs and nothing it does not.
func TestDeployDefault(t *testing.T) {
	c := start(t, "deploy")
	g := NewWithT(t)

	var pods []corev1.Pod
	g.Eventually(func(g Gomega) {
		l, err := c.cs.CoreV1().Pods(managerNS).List(c.ctx, metav1.ListOptions{LabelSelector: managerSelector})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Items).To(HaveLen(2), "two manager replicas")
		for _, p := range l.Items {
			g.Expect(isReady(&p)).To(BeTrue(), "pod %s Ready (readiness probe /readyz)", p.Name)
			g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
			g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeZero(), "pod %s not restarted (liveness probe /healthz)", p.Name)
		}
		pods = l.Items
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		c.stepf("both manager pods run on %s", pods[0].Spec.NodeName)
	}

	c.stepf("leader election")
	var leader string
	g.Eventually(func(g Gomega) {
		l, err := c.cs.CoordinationV1().Leases(managerNS).Get(c.ctx, "frontdesk-controller-leader", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
		holder := *l.Spec.HolderIdentity
		g.Expect(holder).To(Or(HavePrefix(pods[0].Name+"_"), HavePrefix(pods[1].Name+"_")), "a manager pod leads")
		leader = strings.SplitN(holder, "_", 2)[0]
		c.stepf("leader: %s", holder)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	c.stepf("metrics")
	url := c.portForward("pod/"+leader, managerNS, 8443) + "/metrics"
	reader := c.serviceAccountToken("metrics-reader", managerNS+"-metrics-reader-"+c.ns, "frontdesk-metrics-reader")
	nobody := c.serviceAccountToken("nobody", "", "")
	code, body := httpsGet(t, url, "")
	g.Expect(code).To(Equal(http.StatusUnauthorized), "no token: %s", body)
	code, body = httpsGet(t, url, nobody)
	g.Expect(code).To(Equal(http.StatusForbidden), "a token without the metrics-reader role: %s", body)
	code, body = httpsGet(t, url, reader)
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(body).To(ContainSubstring(`controller_runtime_reconcile_total{controller="distributedlock"`), "the leader's controller metrics")

	c.stepf("RBAC as shipped")
	sa := "system:serviceaccount:" + managerNS + ":frontdesk-controller-manager"
	for _, check := range []struct {
		verb, resource string
		want           bool
	}{
		{"update", "leases.coordination.k8s.io", true},
		{"create", "leases.coordination.k8s.io", true},
		{"patch", "pods", true},
		{"watch", "pods", true},
		{"update", "distributedlocks.locks.frontdesk.dev/status", true},
		{"create", "events.events.k8s.io", true},
		// It deletes an admitted pod that did not start in time
		// (spec.podStartTimeoutSeconds), with UID and resourceVersion
		// preconditions; it creates none.
		{"delete", "pods", true},
		{"create", "pods", false},
		{"delete", "leases.coordination.k8s.io", false},
		{"get", "secrets", false},
		{"create", "configmaps", false},
		{"delete", "distributedlocks.locks.frontdesk.dev", false},
	} {
		out, _ := c.kubectl("auth", "can-i", check.verb, check.resource, "--as", sa, "-n", c.ns)
		got := strings.TrimSpace(out) == "yes"
		if got != check.want {
			t.Errorf("manager can %s %s: %q, want %v", check.verb, check.resource, strings.TrimSpace(out), check.want)
		}
	}
	for _, p := range pods {
		logs, err := c.kubectl("-n", managerNS, "logs", p.Name)
		g.Expect(err).NotTo(HaveOccurred(), logs)
		g.Expect(logs).NotTo(ContainSubstring(`is forbidden: User \"`+sa), "pod %s was refused by RBAC", p.Name)
	}
}

func isReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// portForward forwards a local port to the target's port for the rest of
// the test and returns https://127.0.0.1:PORT.
func (t *tc) portForward(target, namespace string, port int) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(t.root, "bin", "k8s", "kubectl"), "--kubeconfig", t.kubeconfig,
		"-n", namespace, "port-forward", target, fmt.Sprintf(":%d", port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case p := <-found:
		return "https://127.0.0.1:" + p
	case <-time.After(30 * time.Second):
		t.Fatalf("kubectl port-forward %s: no port after 30s", target)
		return ""
	}
}

// serviceAccountToken creates a ServiceAccount in the test's namespace,
// binds it to clusterRole when one is named, and returns a token for it.
func (t *tc) serviceAccountToken(name, binding, clusterRole string) string {
	t.Helper()
	_, err := t.cs.CoreV1().ServiceAccounts(t.ns).Create(t.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if clusterRole != "" {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: binding},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: t.ns}},
		}
		if _, err := t.cs.RbacV1().ClusterRoleBindings().Create(t.ctx, crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = t.cs.RbacV1().ClusterRoleBindings().Delete(t.ctx, binding, metav1.DeleteOptions{})
		})
	}
	tr, err := t.cs.CoreV1().ServiceAccounts(t.ns).CreateToken(t.ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// httpsGet GETs url (the manager's self-signed serving certificate is not
// verified) with an optional bearer token, retrying transport errors for a
// while; it returns the status code and the body.
func httpsGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var lastErr error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	t.Fatalf("GET %s: %v", url, lastErr)
	return 0, ""
}
