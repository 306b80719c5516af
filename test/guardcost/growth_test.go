package guardcost

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

func TestGrowth(t *testing.T) {
	if os.Getenv("GUARDCOST_MICRO") == "" {
		t.Skip()
	}
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	base := worstWrites(t)["renewal"]
	ctx := context.Background()
	for _, e := range []string{
		"variables.ann.all(k, k != 'x')",
		"variables.ann.all(k, k != 'x' || k == '')",
		"variables.ann.all(k, [k != 'x', k == ''].exists(b, b))",
		"variables.ann.all(k, true in [k != 'x', k == ''])",
		"size(variables.ann.filter(k, k != 'x')) > 0",
	} {
		for _, n := range []int{100, 400, 1600} {
			w := base
			w.Old, w.New = base.Old.DeepCopy(), base.New.DeepCopy()
			w.Old.Annotations, w.New.Annotations = map[string]string{}, map[string]string{}
			for i := range n {
				w.Old.Annotations[fmt.Sprint("k", i)] = "v"
				w.New.Annotations[fmt.Sprint("k", i)] = "v"
			}
			q := p.DeepCopy()
			q.Spec.Validations = []admissionregistrationv1.Validation{{Expression: e}}
			c, err := Compile(q, celconfig.PerCallLimit*100)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for range 20 {
				if _, err = c.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget*100); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("n=%5d %10s/element  %s", n, time.Since(start)/20/time.Duration(n), e)
		}
	}
}
