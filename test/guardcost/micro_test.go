package guardcost

import (
	"context"
	"os"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

func TestMicro(t *testing.T) {
	if os.Getenv("GUARDCOST_MICRO") == "" {
		t.Skip()
	}
	p, err := LoadPolicy("lease-guard")
	if err != nil {
		t.Fatal(err)
	}
	w := worstWrites(t)["release"]
	ctx := context.Background()
	for _, e := range []string{
		"true",
		"variables.ann == variables.oldAnn",
		"variables.ann.all(k, k != '')",
		"variables.ann.all(k, true)",
		"variables.ann.all(k, k == '' || k != 'x')",
		"variables.ann.all(k, k != 'x' || k == '')",
		"variables.ann.all(k, k == '' ? false : true)",
		"size(variables.ann.filter(k, true)) >= 0",
		"size(variables.ann.filter(k, k != 'x')) >= 0",
		"size(variables.ann.filter(k, variables.oldAnn[?k] != optional.of(variables.ann[k]))) >= 0",
		"size(variables.ann.transformList(k, v, variables.oldAnn[?k] != optional.of(v), k)) >= 0",
		"size(variables.oldAnn.filter(k, !(k in variables.ann))) >= 0",
		"variables.ann.exists(k, k == 'x')",
		"variables.ann.exists_one(k, k == 'locks.frontdesk.dev/lock-uid')",
		"size(variables.ann.map(k, k)) > 0",
		"variables.ann.map(k, k).all(k, k != 'x')",
		"variables.ann.all(k, v, v != 'x')",
	} {
		q := p.DeepCopy()
		q.Spec.Validations = []admissionregistrationv1.Validation{{Expression: e}}
		c, err := Compile(q, celconfig.PerCallLimit*100)
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		start := time.Now()
		for range 50 {
			if r, err = c.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget*100); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%8s cost %7d %v %s", time.Since(start)/50, r.CallCost, r.Errors, e)
	}
}
