package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
)

// An HA control plane: three etcd members and two kube-apiservers, A and B.
// Worker 0 is pointed at A alone; the other workers, both manager replicas
// and the checks go through a load balancer that prefers A. First the etcd
// leader is SIGKILLed while a worker holds the lock (after leadership is
// moved to a member the suite can kill) and restarted. Then A is SIGKILLed
// while worker 0 holds the lock: worker 0 keeps each grant longer than the
// lease, so only noticing its loss can end it, and it must do so before the
// lock is granted again, through B; everyone else fails over to B, and A is
// started again.
func TestHAControlPlaneLosesAnAPIServerAndTheEtcdLeader(t *testing.T) {
	ha := startHAControlPlane(t)
	const ttl = 3
	runScenario(t, scenario{cluster: ha.c, workers: 3, increments: size(10, 24), perGrant: 1, hold: 300 * time.Millisecond, ttl: ttl,
		tune: func(t *testing.T, r *runState, i int, w *workerSpec) {
			if i == 0 {
				w.kubeconfig = ha.directKubeconfig
				w.increments = 2
				w.hold = 2 * ttl * time.Second
			}
		},
		inject: func(t *testing.T, r *runState) {
			for round := range size(1, 3) {
				member := 1 + round%2
				ha.killEtcdLeader(t, r, member)
				ha.restartEtcdMember(t, member)
			}
			ha.killAPIServerA(t, r)
		}})
}

// killAPIServerA SIGKILLs apiserver A while worker 0, which talks to A
// alone, holds the lock and another worker can still take it over; checks
// that worker 0 noticed its loss before the next grant; starts A again.
func (ha *haControlPlane) killAPIServerA(t *testing.T, r *runState) {
	t.Helper()
	var token int64
	pinnedHolder := false
	poll(time.Minute, func() bool {
		i, tok := r.holderWorker()
		othersLeft := !r.finished(1) || !r.finished(2)
		token, pinnedHolder = tok, i == 0 && othersLeft
		return pinnedHolder || !othersLeft || r.finished(0)
	})
	a := ha.apiservers[0]
	old := a.pid
	a.kill(t)
	if pinnedHolder {
		waitFor(t, time.Minute, "a grant through apiserver B", func() bool { _, tok := r.holderWorker(); return tok > token })
		checkGaveUpFirst(t, r, 0, token, "its apiserver SIGKILLed", true)
	} else {
		// Contention picks holders at random: rarely, worker 0 never held
		// while the others had work left. A still dies, with no check of
		// worker 0's grant.
		t.Log("worker-0 did not hold the lock while another worker had work left; killing apiserver A anyway")
	}
	a.start(t, ha.direct)
	t.Logf("kube-apiserver A %d SIGKILLed and started again as %d; load balancer connections so far: %v", old, a.pid, ha.lb.DialCounts())
}

// haControlPlane is three etcd members and two kube-apiservers (A and B)
// behind a load balancer that sends every new connection to A while A
// accepts it, and to B otherwise.
type haControlPlane struct {
	cp      *controlplane.ControlPlane
	members [3]*etcdMember
	// apiservers are A (envtest's, then restarted by the scenario) and B
	// (a second process from A's command line).
	apiservers [2]*apiServer
	// direct is a clientset talking to A only; directKubeconfig is its
	// kubeconfig.
	direct           kubernetes.Interface
	directKubeconfig string
	// lb is the load balancer in front of A and B.
	lb *proxy
	// etcd is a client of all three members, for the scenario's own calls.
	etcd *clientv3.Client
	// c is the cluster as managers, load-balanced workers and the checks
	// see it: through the load balancer.
	c *cluster
}

// etcdMember is one member of the etcd cluster.
type etcdMember struct {
	name      string
	clientURL string
	peerURL   string
	// argv is how the suite starts the member; nil for member 0, which
	// envtest starts and stops.
	argv []string
	cmd  *exec.Cmd
}

// freeLoopbackAddr reserves a loopback port long enough to learn its
// number, and returns host:port.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startHAControlPlane starts etcd members 1 and 2, then envtest with its
// etcd as member 0 of the same cluster and its kube-apiserver (A) talking
// to all three, then apiserver B from A's command line on another port,
// the load balancer, and the two manager replicas behind it.
func startHAControlPlane(t *testing.T) *haControlPlane {
	t.Helper()
	ha := &haControlPlane{}
	t.Cleanup(ha.stop) // safe with nothing started yet
	peers := make([]string, 0, len(ha.members))
	for i := range ha.members {
		m := &etcdMember{name: fmt.Sprintf("etcd-%d", i), clientURL: "http://" + freeLoopbackAddr(t), peerURL: "http://" + freeLoopbackAddr(t)}
		ha.members[i] = m
		peers = append(peers, m.name+"="+m.peerURL)
	}
	initialCluster := strings.Join(peers, ",")
	assets, err := controlplane.Assets("")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ha.members[1:] {
		m.argv = []string{filepath.Join(assets, "etcd"), "--name", m.name, "--data-dir", t.TempDir(),
			"--listen-client-urls", m.clientURL, "--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", initialCluster, "--initial-cluster-state", "new",
			"--initial-cluster-token", "frontdesk-chaos-ha", "--unsafe-no-fsync"}
		m.start(t)
	}

	ha.directKubeconfig = filepath.Join(t.TempDir(), "kubeconfig-a")
	ha.cp, err = controlplane.Start(controlplane.Options{KubeconfigPath: ha.directKubeconfig,
		Configure: func(env *envtest.Environment) { ha.configureEnvtest(env, initialCluster) }})
	if err != nil {
		t.Fatal(err)
	}
	if ha.direct, err = kubernetes.NewForConfig(ha.cp.Config); err != nil {
		t.Fatal(err)
	}

	portA, err := portOf(ha.cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	if ha.apiservers[0], err = findAPIServer(portA); err != nil {
		t.Fatal(err)
	}
	hostB := freeLoopbackAddr(t)
	_, portB, _ := net.SplitHostPort(hostB)
	if ha.apiservers[1], err = ha.apiservers[0].withPort(portB); err != nil {
		t.Fatal(err)
	}
	cfgB := rest.CopyConfig(ha.cp.Config)
	cfgB.Host = "https://" + hostB
	csB, err := kubernetes.NewForConfig(cfgB)
	if err != nil {
		t.Fatal(err)
	}
	ha.apiservers[1].start(t, csB)

	hostA := "127.0.0.1:" + portA
	var lbKubeconfig string
	ha.lb, lbKubeconfig = proxiedKubeconfig(t, ha.directKubeconfig, "ha-lb", hostA, hostB)
	if ha.c, err = newCluster("ha", lbKubeconfig); err != nil {
		t.Fatal(err)
	}
	t.Logf("HA control plane: etcd members %v; kube-apiserver A on %s, B on %s, both on all three members; load balancer at %s",
		ha.clientURLs(), hostA, hostB, ha.c.cfg.Host)
	return ha
}

// configureEnvtest makes envtest's etcd member 0 of the cluster, and its
// kube-apiserver a client of all three members.
func (ha *haControlPlane) configureEnvtest(env *envtest.Environment, initialCluster string) {
	m := ha.members[0]
	env.ControlPlane.Etcd = &envtest.Etcd{URL: &url.URL{Scheme: "http", Host: strings.TrimPrefix(m.clientURL, "http://")}}
	env.ControlPlane.Etcd.Configure().
		Set("name", m.name).
		Set("listen-peer-urls", m.peerURL).
		Set("initial-advertise-peer-urls", m.peerURL).
		Set("initial-cluster", initialCluster).
		Set("initial-cluster-state", "new").
		Set("initial-cluster-token", "frontdesk-chaos-ha")
	env.ControlPlane.GetAPIServer().Configure().Set("etcd-servers", strings.Join(ha.clientURLs(), ","))
}

func (ha *haControlPlane) clientURLs() []string {
	urls := make([]string, 0, len(ha.members))
	for _, m := range ha.members {
		urls = append(urls, m.clientURL)
	}
	return urls
}

// stop ends the managers, the load balancer, the apiservers, and the etcd
// members.
func (ha *haControlPlane) stop() {
	if ha.c != nil {
		ha.c.stopManagers()
	}
	if ha.lb != nil {
		ha.lb.Close()
	}
	for _, a := range ha.apiservers {
		if a != nil && a.cmd != nil {
			_ = a.cmd.Process.Kill()
			_ = a.cmd.Wait()
		}
	}
	if ha.etcd != nil {
		_ = ha.etcd.Close()
	}
	if ha.cp != nil {
		_ = ha.cp.Stop()
	}
	for _, m := range ha.members {
		if m.cmd != nil {
			_ = m.cmd.Process.Kill()
			_ = m.cmd.Wait()
		}
	}
}

// start runs the member (again, on its data directory).
func (m *etcdMember) start(t *testing.T) {
	t.Helper()
	cmd, err := startTracked(m.name, m.argv)
	if err != nil {
		t.Fatal(err)
	}
	m.cmd = cmd
}

// healthy reports whether the member answers /health with a leader.
func (m *etcdMember) healthy() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(m.clientURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// etcdCallTimeout bounds each call to etcd the scenario makes itself.
const etcdCallTimeout = 3 * time.Second

// etcdIDs maps the names of the members that answer to their etcd member
// IDs, and says which ID leads.
func (ha *haControlPlane) etcdIDs(t *testing.T) (map[string]uint64, uint64) {
	t.Helper()
	if ha.etcd == nil {
		cli, err := clientv3.New(clientv3.Config{Endpoints: ha.clientURLs(), DialTimeout: etcdCallTimeout})
		if err != nil {
			t.Fatalf("connecting to etcd: %v", err)
		}
		ha.etcd = cli
	}
	ids := map[string]uint64{}
	var leader uint64
	for _, m := range ha.members {
		ctx, cancel := context.WithTimeout(context.Background(), etcdCallTimeout)
		st, err := ha.etcd.Status(ctx, m.clientURL)
		cancel()
		if err != nil {
			continue // a member that is down has no say
		}
		ids[m.name] = st.Header.MemberId
		leader = st.Leader
	}
	return ids, leader
}

// moveEtcdLeadershipTo makes member i the etcd leader, as an operator would
// with `etcdctl move-leader`: the request goes to the current leader.
func (ha *haControlPlane) moveEtcdLeadershipTo(t *testing.T, i int) {
	t.Helper()
	target := ha.members[i]
	deadline := time.Now().Add(30 * time.Second)
	for {
		ids, leader := ha.etcdIDs(t)
		if leader != 0 && leader == ids[target.name] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out moving etcd leadership to %s", target.name)
		}
		for _, m := range ha.members {
			if leader != 0 && ids[m.name] == leader {
				if err := moveLeader(m.clientURL, ids[target.name]); err != nil {
					t.Logf("moving etcd leadership from %s to %s: %v", m.name, target.name, err)
				}
			}
		}
		time.Sleep(500 * time.Millisecond) // let the transfer happen before asking again
	}
}

// moveLeader asks the leader at endpoint to hand leadership to transferee.
func moveLeader(endpoint string, transferee uint64) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: etcdCallTimeout})
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", endpoint, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), etcdCallTimeout)
	defer cancel()
	if _, err := cli.MoveLeader(ctx, transferee); err != nil {
		return fmt.Errorf("move-leader: %w", err)
	}
	return nil
}

// killEtcdLeader waits for a worker to hold the lock, makes member i
// (started by the suite) the etcd leader, SIGKILLs it, and waits until the
// remaining two elect a leader and the cluster takes writes through the
// load balancer.
func (ha *haControlPlane) killEtcdLeader(t *testing.T, r *runState, i int) {
	t.Helper()
	var holder int
	var token int64
	waitFor(t, time.Minute, "a holder", func() bool { holder, token = r.holderWorker(); return holder >= 0 })
	ha.moveEtcdLeadershipTo(t, i)
	m := ha.members[i]
	if err := m.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s: %v", m.name, err)
	}
	_ = m.cmd.Wait()
	start := time.Now()
	waitFor(t, time.Minute, "the cluster to take writes without the etcd leader", func() bool {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "etcd-write-probe-", Namespace: "default"}}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := ha.c.clientset.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
		return err == nil
	})
	working := 0
	for w := range r.workers {
		if !r.finished(w) {
			working++
		}
	}
	t.Logf("SIGKILLed etcd leader %s while %s held token %d (%d workers still working); the two left took writes again after %s",
		m.name, r.workers[holder].Name, token, working, time.Since(start).Round(time.Millisecond))
}

// restartEtcdMember starts member i again on its data and waits until it
// is healthy.
func (ha *haControlPlane) restartEtcdMember(t *testing.T, i int) {
	t.Helper()
	m := ha.members[i]
	m.start(t)
	waitFor(t, time.Minute, m.name+" to rejoin", m.healthy)
}
