package integration

import (
	"bufio"
	"bytes"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	_ "modernc.org/sqlite"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/frontdesk-dev/frontdesk/api/v1alpha1"
	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/pkg/fencing"
)

// createExampleLock creates the DistributedLock of examples/<dir>/lock.yaml
// in namespace, with a lease of leaseSeconds (the tests' are short), and
// waits until it is Ready.
func createExampleLock(t *testing.T, dir, namespace string, leaseSeconds int32) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "examples", dir, "lock.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lock := &locksv1alpha1.DistributedLock{}
	if err := yaml.UnmarshalStrict(raw, lock); err != nil {
		t.Fatalf("examples/%s/lock.yaml: %v", dir, err)
	}
	lock.Namespace = namespace
	lock.Spec.LeaseDurationSeconds = leaseSeconds
	createReadyLock(t, lock)
}

// exampleDSN is a SQLite database in a directory of the test's, opened as
// the examples open theirs by default: WAL, and a busy timeout, so that
// several processes can share it.
func exampleDSN(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "example.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
}

// exampleProcess is a running example program and the lines it printed.
type exampleProcess struct {
	name   string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{}
	mu     sync.Mutex
	lines  []string
}

// startExample starts examples/<program> with args and the suite's
// kubeconfig, and kills it when the test ends.
func startExample(t *testing.T, name, program string, args ...string) *exampleProcess {
	t.Helper()
	cmd := exec.Command(filepath.Join(examplePrograms(t), program), append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
	p := &exampleProcess{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s printed:\n%s\nstderr:\n%s", name, strings.Join(p.output(), "\n"), p.stderr.String())
		}
	})
	return p
}

func (p *exampleProcess) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// waitFor waits until a line starting with prefix is printed and returns it.
func (p *exampleProcess) waitFor(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, l := range p.output() {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the output; the deadline is the assertion
	}
	t.Fatalf("%s printed no line %q within %s", p.name, prefix, timeout)
	return ""
}

// exit waits for the process to end and returns its exit status.
func (p *exampleProcess) exit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}

func (p *exampleProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling %s: %v", p.name, err)
	}
}

// fencedRow is a row the examples write: the fencing key and token it was
// written with, by whom.
type fencedRow struct {
	key    string
	token  int64
	writer string
}

// fencedRows reads table's rows in the order they were written (SQLite's
// rowid), and the guard's highest token per key.
func fencedRows(t *testing.T, dsn, table, writer string) ([]fencedRow, map[string]int64) {
	t.Helper()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(fmt.Sprintf(`SELECT fencing_key, token, %s FROM %s ORDER BY rowid`, writer, table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []fencedRow
	for rows.Next() {
		var r fencedRow
		if err := rows.Scan(&r.key, &r.token, &r.writer); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	highest := map[string]int64{}
	hw, err := db.Query(`SELECT lock_name, token FROM ` + fencing.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Close()
	for hw.Next() {
		var key string
		var token int64
		if err := hw.Scan(&key, &token); err != nil {
			t.Fatal(err)
		}
		highest[key] = token
	}
	return out, highest
}

// tokensNeverGoBack fails if, for one key, a row was written with a lower
// token after a row with a higher one: what fencing forbids.
func tokensNeverGoBack(t *testing.T, rows []fencedRow) {
	t.Helper()
	last := map[string]int64{}
	for i, r := range rows {
		if r.token < last[r.key] {
			t.Errorf("row %d (%s) was written with token %d of %s after token %d", i+1, r.writer, r.token, r.key, last[r.key])
		}
		last[r.key] = max(last[r.key], r.token)
	}
}

// examples/sql-worker, as its README runs it: workers on the locks named
// billing of two namespaces write to one database through one SQL guard,
// each fenced on its grant's key, so the second namespace's first token
// (1) is accepted after the first's 2. Then a worker is frozen (SIGSTOP)
// past its lease, another takes over and writes with the next token, and
// the thawed worker writes nothing more and exits 75.
func TestSQLWorkerExample(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	createExampleLock(t, "sql-worker", nsA, 2)
	createExampleLock(t, "sql-worker", nsB, 2)
	keyA, keyB := fencing.LockKey(nsA, "billing"), fencing.LockKey(nsB, "billing")
	dsn := exampleDSN(t)
	g := NewWithT(t)

	run := func(name, ns string, args ...string) *exampleProcess {
		return startExample(t, name, "sql-worker", append([]string{"--namespace", ns, "--lock", "billing", "--dsn", dsn}, args...)...)
	}
	for i, ns := range []string{nsA, nsA, nsB} {
		w := run(fmt.Sprintf("worker %d", i+1), ns, "--entries", "2", "--interval", "0")
		g.Expect(w.exit(t, 30*time.Second)).To(Equal(0), w.stderr.String())
		g.Expect(w.output()).To(ContainElement(HavePrefix("holding lock " + ns + "/billing")))
		g.Expect(w.output()).To(ContainElement(HaveSuffix(fmt.Sprintf("(fencing key %s/billing)", ns))))
	}

	// Frozen right after a write, so it holds no transaction (SQLite has
	// one writer at a time): its next write is a second away.
	frozen := run("frozen worker", nsA, "--entries", "1000", "--interval", "1s")
	frozen.waitFor(t, "wrote entry 2 with fencing token 3", 20*time.Second)
	frozen.signal(t, syscall.SIGSTOP)
	next := run("next worker", nsA, "--entries", "2", "--interval", "0", "--wait", "30s")
	g.Expect(next.exit(t, 40*time.Second)).To(Equal(0), next.stderr.String())
	g.Expect(next.output()).To(ContainElement("wrote entry 2 with fencing token 4"))
	frozen.signal(t, syscall.SIGCONT)
	g.Expect(frozen.exit(t, 20*time.Second)).To(Equal(75), "the thawed worker: %s", frozen.stderr.String())
	// Which comes first on the thaw, the grant's own expiry or the
	// database's refusal, is up to the scheduler: either stops it.
	g.Expect(frozen.stderr.String()).To(Or(ContainSubstring("stale fencing token 3"), ContainSubstring("lock lease lost")))
	t.Logf("the thawed worker: %s", strings.TrimSpace(frozen.stderr.String()))

	rows, highest := fencedRows(t, dsn, "ledger", "holder")
	tokensNeverGoBack(t, rows)
	g.Expect(highest).To(Equal(map[string]int64{keyA: 4, keyB: 1}), "one highest token per lock")
	perToken := map[fencedRow]int{}
	for _, r := range rows {
		perToken[fencedRow{key: r.key, token: r.token}]++
	}
	g.Expect(perToken).To(HaveKeyWithValue(fencedRow{key: keyA, token: 1}, 2))
	g.Expect(perToken).To(HaveKeyWithValue(fencedRow{key: keyA, token: 2}, 2))
	g.Expect(perToken).To(HaveKeyWithValue(fencedRow{key: keyB, token: 1}, 2))
	g.Expect(perToken).To(HaveKeyWithValue(fencedRow{key: keyA, token: 4}, 2))
	g.Expect(perToken[fencedRow{key: keyA, token: 3}]).To(BeNumerically(">=", 2), "the frozen worker's writes before it froze")
	g.Expect(rows[len(rows)-1].token).To(BeEquivalentTo(4), "nothing was written after the next holder's writes")
}

// examples/fenced-leader, as its README runs it: two replicas elect a
// leader on the Lease of the lock my-operator-lock; the leader writes with
// its Term's key and token. SIGTERM releases the Lease, the other replica
// leads with the next token, and every row carries its writer's Term.
func TestFencedLeaderExample(t *testing.T) {
	ns := newNamespace(t)
	createExampleLock(t, "fenced-leader", ns, 3)
	key := fencing.LockKey(ns, "my-operator-lock")
	dsn := exampleDSN(t)
	g := NewWithT(t)

	replica := func(identity string) *exampleProcess {
		return startExample(t, "replica "+identity, "fenced-leader", "--namespace", ns, "--identity", identity, "--dsn", dsn,
			"--interval", "200ms", "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "300ms")
	}
	a := replica("a")
	g.Expect(a.waitFor(t, "leading with fencing token", 20*time.Second)).To(Equal(
		fmt.Sprintf("leading with fencing token 1 (fencing key %s)", key)))
	a.waitFor(t, "wrote action 2 with fencing token 1", 10*time.Second)
	b := replica("b")
	b.waitFor(t, "the leader is a", 10*time.Second)

	a.signal(t, syscall.SIGTERM)
	g.Expect(a.exit(t, 10*time.Second)).To(Equal(0), a.stderr.String())
	g.Expect(b.waitFor(t, "leading with fencing token", 10*time.Second)).To(Equal(
		fmt.Sprintf("leading with fencing token 2 (fencing key %s)", key)))
	b.waitFor(t, "wrote action 2 with fencing token 2", 10*time.Second)
	b.signal(t, syscall.SIGTERM)
	g.Expect(b.exit(t, 10*time.Second)).To(Equal(0), b.stderr.String())

	rows, highest := fencedRows(t, dsn, "actions", "leader")
	tokensNeverGoBack(t, rows)
	g.Expect(highest).To(Equal(map[string]int64{key: 2}))
	for _, r := range rows {
		g.Expect(r.key).To(Equal(key))
		g.Expect(r.token).To(Equal(map[string]int64{"a": 1, "b": 2}[r.writer]), "row %+v", r)
	}
	eventually(t, 10*time.Second, func(g Gomega) {
		g.Expect(getLock(g, ns, "my-operator-lock").Status.FencingToken).To(BeEquivalentTo(2))
	})
}
