// Package guardcost evaluates the lease-guard ValidatingAdmissionPolicy
// (config/lease-policy/policy.yaml) in process, with the apiserver's own CEL
// libraries (k8s.io/apiserver: the environment, the variable composition,
// the cost tracking and the order of evaluation of its
// ValidatingAdmissionPolicy plugin), on a Lease write, and reports its
// runtime CEL cost against the apiserver's limits:
//
//   - per expression, celconfig.PerCallLimit (1,000,000): every program,
//     each variable (evaluated once per call, when first used) and each
//     validation and message expression apart, is cut off past it;
//   - per call, celconfig.RuntimeCELCostBudget (10,000,000): the sum of the
//     validations and the variables they evaluate, for one binding and one
//     request; the message expressions get what remains of it;
//   - celconfig.RuntimeCELCostBudgetMatchConditions (2,500,000) for the
//     matchConditions.
//
// For a ValidatingAdmissionPolicy the apiserver enforces runtime cost only
// (its object and oldObject are dynamically typed: there is no static
// estimate to refuse a policy for), so these are the limits that matter.
// It also builds the worst Lease the guard's rules allow (WorstQueue).
package guardcost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types/ref"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/frontdesk-dev/frontdesk/internal/controlplane"
	"github.com/frontdesk-dev/frontdesk/test/guard"
)

// LoadPolicy reads the named ValidatingAdmissionPolicy from
// config/lease-policy/policy.yaml.
func LoadPolicy(name string) (*admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, guard.PolicyFile)
	if other := os.Getenv("GUARDCOST_POLICY"); other != "" {
		path = other // another version of the policy, to compare with
	}
	policies, err := guard.ReadPolicies(path)
	if err != nil {
		return nil, err
	}
	for _, p := range policies {
		if p.Name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no ValidatingAdmissionPolicy %s in %s", name, path)
}

// Compiled is a policy compiled as the apiserver compiles it, but with a
// per-expression cost limit of the caller's choosing.
type Compiled struct {
	Policy          *admissionregistrationv1.ValidatingAdmissionPolicy
	PerCallLimit    uint64
	match           plugincel.ConditionEvaluator
	validations     plugincel.ConditionEvaluator
	messages        plugincel.ConditionEvaluator
	compileProblems []error
}

// Compile compiles p with the apiserver's environment (its compatibility
// version's, with strict cost), each program cut off past perCallLimit.
func Compile(p *admissionregistrationv1.ValidatingAdmissionPolicy, perCallLimit uint64) (*Compiled, error) {
	base := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
	envSet, err := base.Extend(environment.VersionedOptions{
		IntroducedVersion: version.MajorMinor(1, 0),
		ProgramOptions:    []cel.ProgramOption{cel.CostLimit(perCallLimit)},
	})
	if err != nil {
		return nil, err
	}
	compiler, err := plugincel.NewCompositedCompiler(envSet)
	if err != nil {
		return nil, err
	}
	optionalVars := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
	messageVars := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil}
	vars := make([]plugincel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		vars[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	c := &Compiled{Policy: p, PerCallLimit: perCallLimit}
	for _, v := range vars {
		if r := compiler.CompileAndStoreVariable(v, optionalVars, environment.StoredExpressions); r.Error != nil {
			c.compileProblems = append(c.compileProblems, fmt.Errorf("variable %s: %w", v.GetName(), r.Error))
		}
	}
	matches := make([]plugincel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i := range p.Spec.MatchConditions {
		matches[i] = (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i])
	}
	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" && os.Getenv("GUARDCOST_NO_MESSAGES") == "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	c.match = compiler.CompileCondition(matches, optionalVars, environment.StoredExpressions)
	c.validations = compiler.CompileCondition(validations, optionalVars, environment.StoredExpressions)
	c.messages = compiler.CompileCondition(messages, messageVars, environment.StoredExpressions)
	for _, e := range [][]error{c.match.CompilationErrors(), c.validations.CompilationErrors(), c.messages.CompilationErrors()} {
		c.compileProblems = append(c.compileProblems, e...)
	}
	if len(c.compileProblems) > 0 {
		return nil, fmt.Errorf("compiling %s: %v", p.Name, c.compileProblems)
	}
	return c, nil
}

// Write is one Lease write as the apiserver's admission sees it.
type Write struct {
	Old, New *coordinationv1.Lease
	// User is who writes (its username, groups and extra: a pod-bound
	// token's pod UID).
	User user.Info
	// Allowed answers the policy's authorizer checks (break, prioritize);
	// nil: nothing is allowed.
	Allowed func(verb string) bool
}

// Result is what one evaluation of the policy on a write came to.
type Result struct {
	// Matched: the matchConditions let the policy judge the write.
	Matched bool
	// Denied lists the validations (by index) that refused the write, and
	// Errors those that could not be evaluated (a cost limit reached,
	// above all); both empty: the write is admitted.
	Denied []int
	Errors []string
	// MessageErrors are the message expressions that could not be
	// evaluated (the apiserver falls back to the static message).
	MessageErrors []string
	// Messages are the messages of the refusing validations, in the order
	// of Denied ("" where the message expression gave none).
	Messages []string
	// MatchCost is the runtime cost of the matchConditions; CallCost that
	// of the validations with the variables they evaluated (what the
	// per-call budget is charged); MessageCost that of the message
	// expressions, which the apiserver evaluates on every call, whatever
	// the validations decided, from what remains of the budget.
	MatchCost, CallCost, MessageCost int64
}

// Admitted says whether the write passes.
func (r Result) Admitted() bool { return len(r.Denied) == 0 && len(r.Errors) == 0 }

type authz struct{ allowed func(string) bool }

func (a authz) Authorize(_ context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.allowed != nil && a.allowed(attrs.GetVerb()) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
}

var (
	leaseGVK = schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}
	leaseGVR = metav1.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// Evaluate runs c on w as the apiserver's validator does: matchConditions
// (their own budget), then the validations with the per-call budget, then
// the message expressions with what remains.
func (c *Compiled) Evaluate(ctx context.Context, w Write, budget int64) (Result, error) {
	op := admission.Update
	var old runtime.Object
	if w.Old != nil {
		old = w.Old
	} else {
		op = admission.Create
	}
	attrs := admission.NewAttributesRecord(w.New, old, leaseGVK, w.New.Namespace, w.New.Name,
		schema.GroupVersionResource(leaseGVR), "", op, &metav1.UpdateOptions{}, false, w.User)
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: leaseGVK}
	va.VersionedObject.Set(w.New)
	if w.Old != nil {
		va.VersionedOldObject.Set(w.Old)
	}
	request := plugincel.CreateAdmissionRequest(attrs, leaseGVR, metav1.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.New.Namespace}}
	a := authz{allowed: w.Allowed}
	vars := plugincel.OptionalVariableBindings{Authorizer: a}
	var res Result
	matchBudget := int64(celconfig.RuntimeCELCostBudgetMatchConditions)
	evals, remaining, err := c.match.ForInput(ctx, va, request, vars, nil, matchBudget)
	if err != nil { // the policy's error (an exhausted budget, above all): the result's, as the apiserver refuses the write
		res.Errors = append(res.Errors, "matchConditions: "+err.Error())
		return res, nil //nolint:nilerr // reported in the result
	}
	res.MatchCost = matchBudget - remaining
	res.Matched = true
	for i, e := range evals {
		if e.Error != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("matchCondition %d: %v", i, e.Error))
		} else if e.EvalResult != nil && !isTrue(e.EvalResult) {
			res.Matched = false
		}
	}
	if !res.Matched || len(res.Errors) > 0 {
		return res, nil
	}
	evals, remaining, err = c.validations.ForInput(ctx, va, request, vars, ns, budget)
	if err != nil {
		res.Errors = append(res.Errors, "validations: "+err.Error())
		return res, nil //nolint:nilerr // reported in the result
	}
	res.CallCost = budget - remaining
	for i, e := range evals {
		switch {
		case e.Error != nil:
			res.Errors = append(res.Errors, fmt.Sprintf("validation %d: %v", i, e.Error))
		case !isTrue(e.EvalResult):
			res.Denied = append(res.Denied, i)
		}
	}
	msgs, after, err := c.messages.ForInput(ctx, va, request, plugincel.OptionalVariableBindings{}, ns, remaining)
	if err != nil {
		res.MessageErrors = append(res.MessageErrors, "message expressions: "+err.Error())
		return res, nil //nolint:nilerr // reported in the result
	}
	for i, e := range msgs {
		if e.Error != nil {
			res.MessageErrors = append(res.MessageErrors, fmt.Sprintf("message expression %d: %v", i, e.Error))
		}
	}
	for _, i := range res.Denied {
		m := ""
		if i < len(msgs) && msgs[i].Error == nil && msgs[i].EvalResult != nil {
			m, _ = msgs[i].EvalResult.Value().(string)
		}
		res.Messages = append(res.Messages, m)
	}
	res.MessageCost = remaining - after
	return res, nil
}

// isTrue says whether v is CEL's true.
func isTrue(v ref.Val) bool {
	if v == nil {
		return false
	}
	b, ok := v.Value().(bool)
	return ok && b
}

// ExpressionCost is the smallest per-expression limit under which every
// program that w makes the policy run stays (the cost of its most costly
// single expression), found by bisection to within 1 % (from above); at
// most maxLimit.
func ExpressionCost(ctx context.Context, p *admissionregistrationv1.ValidatingAdmissionPolicy, w Write, maxLimit uint64) (uint64, error) {
	fits := func(limit uint64) (bool, error) {
		c, err := Compile(p, limit)
		if err != nil {
			return false, err
		}
		r, err := c.Evaluate(ctx, w, celconfig.RuntimeCELCostBudget)
		if err != nil {
			return false, err
		}
		errs := append(slices.Clone(r.Errors), r.MessageErrors...)
		for _, e := range errs {
			if !strings.Contains(e, "cost") {
				return false, fmt.Errorf("evaluating with limit %d: %s", limit, e)
			}
		}
		return len(errs) == 0, nil
	}
	ok, err := fits(maxLimit)
	if err != nil || !ok {
		return maxLimit, err
	}
	lo, hi := uint64(0), maxLimit // fits(hi), !fits(lo) unless 0
	for hi-lo > max(hi/100, 1) {
		mid := lo + (hi-lo)/2
		ok, err := fits(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}
