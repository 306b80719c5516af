package localrun

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
)

// The README's quick start, end to end: a real control plane, the manager,
// the sample applied and `kubectl get distributedlocks` showing it Ready.
func TestQuickStartShowsSampleLock(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = Run(ctx, Options{
		SamplePaths:        []string{filepath.Join(root, "config", "samples", "locks_v1alpha1_distributedlock.yaml")},
		Namespace:          "default",
		KubeconfigPath:     filepath.Join(t.TempDir(), "kubeconfig"),
		MetricsBindAddress: "0",
		ExitWhenReady:      true,
	}, &out)
	if err != nil {
		t.Fatalf("quick start failed: %v\noutput:\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`kubectl --kubeconfig /\S+ get distributedlocks -n default`),
		regexp.MustCompile(`NAME\s+HOLDER\s+TOKEN\s+HELD\s+EXPIRES\s+READY\s+LEASE\s+POD\s+AGE`),
		regexp.MustCompile(`(?m)^billing\s+False\s+True\s+billing\s+\d+s$`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output does not match %s:\n%s", want, text)
		}
	}
}
