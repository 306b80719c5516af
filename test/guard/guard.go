// Package guard evaluates the lease guard, config/lease-policy/policy.yaml
// as shipped, the way kube-apiserver's ValidatingAdmissionPolicy plugin
// does: with k8s.io/apiserver's compiler and validator (its CEL
// environment, variable composition, match conditions, message
// expressions, authorizer library and runtime cost budget), on Lease writes
// built in Go. The differential tests beside it check the guard's CEL
// against the one grammar of a lock's Lease, pkg/lease/grammar.go: the
// guard admits exactly the values Go's parser accepts, and reads the same
// numbers from them.
//
// What is the apiserver's and what is this package's: Compile repeats the
// plugin's compilePolicy (k8s.io/apiserver/pkg/admission/plugin/policy/
// validating, unexported) line for line, with the CEL base environment of a
// chosen compatibility version instead of the library's default, so that
// the policy is also compiled as the oldest kube-apiserver frontdesk
// supports compiles it; evaluation is the plugin's own validator. What the
// plugin's dispatcher adds is not repeated: binding lookup (the shipped
// bindings match every Lease and only Deny), namespace and object
// selectors (the bindings have none), and conversion to the policy's
// version (the Leases are coordination.k8s.io/v1 already). Params are not
// bound: lease-create-guard, the one policy with a paramKind, is compiled
// and checked but not evaluated.
package guard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	celgo "github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/frontdesk-dev/frontdesk/internal/manifests"
)

// PolicyFile is the shipped policy, relative to the repository's root.
var PolicyFile = filepath.Join("config", "lease-policy", "policy.yaml")

var (
	leaseGVK = coordinationv1.SchemeGroupVersion.WithKind("Lease")
	leaseGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")
)

// Target is a kube-apiserver the guard is compiled for: the CEL base
// environment of its compatibility version, and the form in which it binds
// object and oldObject.
type Target struct {
	// Name is what failures call it.
	Name string
	// Compatibility is the CEL environment's version: a kube-apiserver's
	// is its minimum compatibility version, one minor below its own.
	Compatibility *version.Version
	// Unstructured binds object and oldObject as unstructured maps, as
	// kube-apiserver up to 1.36 does; later ones bind the typed objects
	// (the library's schemaless typed values), which this library does
	// for typed objects.
	Unstructured bool
}

// Targets are the kube-apiserver versions frontdesk supports at both ends:
// the one this library is (k8s.io/apiserver v0.37, so 1.37) and 1.33,
// whose CEL compatibility version is 1.32.
func Targets() []Target {
	return []Target{
		{Name: "kube-apiserver 1.37 (CEL " + environment.DefaultCompatibilityVersion().String() + ")",
			Compatibility: environment.DefaultCompatibilityVersion()},
		{Name: "kube-apiserver 1.33 (CEL 1.32)", Compatibility: version.MajorMinor(1, 32), Unstructured: true},
	}
}

// LoadPolicies reads the shipped ValidatingAdmissionPolicies, refusing
// fields the API does not know.
func LoadPolicies() ([]*admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	return ReadPolicies(filepath.Join(root, PolicyFile))
}

// ReadPolicies reads the ValidatingAdmissionPolicies of the file at path,
// refusing fields the API does not know.
func ReadPolicies(path string) ([]*admissionregistrationv1.ValidatingAdmissionPolicy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := manifests.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	var out []*admissionregistrationv1.ValidatingAdmissionPolicy
	for _, obj := range objs {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, p, true); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", path, obj.GetKind(), obj.GetName(), err)
		}
		if p.Kind != "ValidatingAdmissionPolicy" {
			return nil, fmt.Errorf("%s: unexpected %s %s", path, p.Kind, p.Name)
		}
		out = append(out, p)
	}
	return out, nil
}

// Policy is one ValidatingAdmissionPolicy compiled for a Target.
type Policy struct {
	Spec      *admissionregistrationv1.ValidatingAdmissionPolicy
	validator validating.Validator
	messages  plugincel.ConditionEvaluator
	compiler  *plugincel.CompositedCompiler
	vars      plugincel.OptionalVariableDeclarations
}

// Guard is the shipped policies compiled for one Target.
type Guard struct {
	Target   Target
	Policies []*Policy
}

// Compile compiles every shipped policy for t, as the plugin's
// compilePolicy does, and fails on any expression that does not compile:
// the plugin would only find out when it evaluates the expression (and
// deny, failurePolicy Fail). Each expression is also compiled as the
// apiserver compiles a policy it is asked to store (environment
// NewExpressions, which admits only what t's compatibility version
// offers).
func Compile(t Target) (*Guard, error) {
	specs, err := LoadPolicies()
	if err != nil {
		return nil, err
	}
	return New(t, specs)
}

// New compiles the given policies for t, as Compile does.
func New(t Target, specs []*admissionregistrationv1.ValidatingAdmissionPolicy) (*Guard, error) {
	g := &Guard{Target: t}
	var errs []error
	for _, spec := range specs {
		p, err := compilePolicy(spec, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", spec.Name, err))
			continue
		}
		g.Policies = append(g.Policies, p)
	}
	return g, errors.Join(errs...)
}

// expression is an expression of the policy, with the types it may return.
type expression struct {
	expr  string
	types []*celgo.Type
}

func (e expression) GetExpression() string      { return e.expr }
func (e expression) ReturnTypes() []*celgo.Type { return e.types }

// compilePolicy is the plugin's compilePolicy (plugin.go) with t's base
// environment, keeping the compiler and the message expressions' evaluator
// for Probe and Review.
func compilePolicy(policy *admissionregistrationv1.ValidatingAdmissionPolicy, t Target) (*Policy, error) {
	hasParam := policy.Spec.ParamKind != nil
	optionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: true}
	expressionOptionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: false}
	failurePolicy := policy.Spec.FailurePolicy
	filterCompiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(t.Compatibility))
	if err != nil {
		return nil, err
	}
	var errs []error
	// The plugin stores each variable's compilation, error or not (an
	// error surfaces when an expression reads the variable); here each is
	// also checked, in both modes, before it is stored.
	for _, v := range policy.Spec.Variables {
		accessor := &validating.Variable{Name: v.Name, Expression: v.Expression}
		if err := checkCompiles(filterCompiler, accessor, optionalVars); err != nil {
			errs = append(errs, fmt.Errorf("variable %s: %w", v.Name, err))
		}
		filterCompiler.CompileAndStoreVariable(accessor, optionalVars, environment.StoredExpressions)
	}

	var matcher matchconditions.Matcher
	if len(policy.Spec.MatchConditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(policy.Spec.MatchConditions))
		for i := range policy.Spec.MatchConditions {
			accessors[i] = (*matchconditions.MatchCondition)(&policy.Spec.MatchConditions[i])
			if err := checkCompiles(filterCompiler, accessors[i], optionalVars); err != nil {
				errs = append(errs, fmt.Errorf("matchCondition %s: %w", policy.Spec.MatchConditions[i].Name, err))
			}
		}
		matcher = matchconditions.NewMatcher(filterCompiler.CompileCondition(accessors, optionalVars, environment.StoredExpressions),
			failurePolicy, "policy", "validate", policy.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	for i, v := range policy.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if err := checkCompiles(filterCompiler, validations[i], optionalVars); err != nil {
			errs = append(errs, fmt.Errorf("validation %d: %w", i, err))
		}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
			if err := checkCompiles(filterCompiler, messages[i], expressionOptionalVars); err != nil {
				errs = append(errs, fmt.Errorf("validation %d's messageExpression: %w", i, err))
			}
		}
	}
	if len(policy.Spec.AuditAnnotations) > 0 {
		errs = append(errs, errors.New("auditAnnotations: this package does not evaluate them"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	messageFilter := filterCompiler.CompileCondition(messages, expressionOptionalVars, environment.StoredExpressions)
	return &Policy{
		Spec: policy,
		validator: validating.NewValidator(
			filterCompiler.CompileCondition(validations, optionalVars, environment.StoredExpressions),
			matcher,
			filterCompiler.CompileCondition(nil, optionalVars, environment.StoredExpressions),
			messageFilter,
			failurePolicy,
			nil,
		),
		messages: messageFilter,
		compiler: filterCompiler,
		vars:     optionalVars,
	}, nil
}

// checkCompiles compiles e in both of the apiserver's modes: as a stored
// policy's expression, and as a new one.
func checkCompiles(c *plugincel.CompositedCompiler, e plugincel.ExpressionAccessor, vars plugincel.OptionalVariableDeclarations) error {
	var errs []error
	for _, mode := range []environment.Type{environment.NewExpressions, environment.StoredExpressions} {
		if r := c.CompileCELExpression(e, vars, mode); r.Error != nil {
			errs = append(errs, fmt.Errorf("%v mode: %w", mode, r.Error))
		}
	}
	return errors.Join(errs...)
}

// Policy is the compiled policy named name, or nil.
func (g *Guard) Policy(name string) *Policy {
	i := slices.IndexFunc(g.Policies, func(p *Policy) bool { return p.Spec.Name == name })
	if i < 0 {
		return nil
	}
	return g.Policies[i]
}

// Request is a Lease write (or delete) as admission sees it.
type Request struct {
	Operation admission.Operation
	// Old and New are the Lease before and after (Old nil on CREATE, New
	// nil on DELETE).
	Old, New *coordinationv1.Lease
	User     user.Info
	// Allowed are the verbs the authorizer allows User on the lock
	// (distributedlocks.locks.frontdesk.dev): "break", "prioritize".
	Allowed []string
	// NamespaceDeleting marks the Lease's namespace as being deleted.
	NamespaceDeleting bool
}

// Denial is one reason a policy refused a request.
type Denial struct {
	Policy string
	// Validation is the index of the validation in the policy, -1 when the
	// policy failed as a whole (a match condition's error, the budget).
	Validation int
	Message    string
	// Error is true when the validation did not evaluate (an error: with
	// failurePolicy Fail, a denial).
	Error bool
}

// String is d for failures.
func (d Denial) String() string {
	kind := "refused"
	if d.Error {
		kind = "error"
	}
	return fmt.Sprintf("%s[%d] %s: %s", d.Policy, d.Validation, kind, d.Message)
}

// Result is what the guard answered.
type Result struct {
	// Applied are the policies whose matchConstraints and match conditions
	// took the request.
	Applied []string
	Denials []Denial
	// MessageErrors are the messageExpressions of refusing validations
	// that failed to give a message (an error, or not a string): the
	// apiserver then answers with the validation's expression as the
	// message. The answer stays a refusal (kube-apiserver 1.33 to 1.37
	// only log the error), but a client that looks for a message
	// (lease.StaleQueueRefusal) no longer finds it.
	MessageErrors []string
	// MessagesDropped are messages the apiserver would drop likewise: more
	// than one line, or longer than it takes. They quote what the request
	// carries (a username with a newline, say).
	MessagesDropped []string
}

// Admitted is whether the guard lets the request through.
func (r Result) Admitted() bool { return len(r.Denials) == 0 }

// String is r for failures: the policies that applied and each denial.
func (r Result) String() string {
	if r.Admitted() {
		return fmt.Sprintf("admitted (by %v)", r.Applied)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "refused (by %v):", r.Applied)
	for _, d := range r.Denials {
		b.WriteString("\n  " + d.String())
	}
	return b.String()
}

// Review evaluates every policy of g that takes req, as the apiserver
// would with the shipped bindings (validationActions Deny), and checks the
// message expressions of every validation that refused.
func (g *Guard) Review(req Request) Result {
	var res Result
	for _, p := range g.Policies {
		if !p.matches(req) {
			continue
		}
		if p.Spec.Spec.ParamKind != nil {
			continue // params are not bound here: see the package's doc
		}
		attr, ns := g.attributes(req)
		r := p.validator.Validate(context.Background(), leaseGVR, attr, nil, ns, celconfig.RuntimeCELCostBudget, authz(req.Allowed))
		if len(r.Decisions) > 0 {
			res.Applied = append(res.Applied, p.Spec.Name)
		}
		var failed []int
		for i, d := range r.Decisions {
			if d.Action == validating.ActionAdmit {
				continue
			}
			index := i
			if len(r.Decisions) != len(p.Spec.Spec.Validations) {
				index = -1
			}
			res.Denials = append(res.Denials, Denial{Policy: p.Spec.Name, Validation: index, Message: d.Message,
				Error: d.Evaluation == validating.EvalError})
			if index >= 0 && d.Evaluation == validating.EvalDeny {
				failed = append(failed, index)
			}
		}
		if len(failed) > 0 {
			errs, dropped := g.checkMessages(p, req, failed)
			res.MessageErrors = append(res.MessageErrors, errs...)
			res.MessagesDropped = append(res.MessagesDropped, dropped...)
		}
	}
	return res
}

// checkMessages evaluates the message expressions of the failed
// validations, as the validator does, and reports those that did not give
// a message the apiserver would use.
func (g *Guard) checkMessages(p *Policy, req Request, failed []int) (out, dropped []string) {
	attr, ns := g.attributes(req)
	request := plugincel.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(leaseGVR), metav1.GroupVersionKind(leaseGVK))
	results, _, err := p.messages.ForInput(context.Background(), attr, request, plugincel.OptionalVariableBindings{}, plugincel.CreateNamespaceObject(ns),
		celconfig.RuntimeCELCostBudget)
	if err != nil {
		return []string{fmt.Sprintf("%s: message expressions: %v", p.Spec.Name, err)}, nil
	}
	for _, i := range failed {
		if p.Spec.Spec.Validations[i].MessageExpression == "" {
			continue
		}
		r := results[i]
		switch s, ok := refString(r.EvalResult); {
		case r.Error != nil:
			out = append(out, fmt.Sprintf("%s[%d]: messageExpression: %v", p.Spec.Name, i, r.Error))
		case !ok || strings.TrimSpace(s) == "":
			out = append(out, fmt.Sprintf("%s[%d]: messageExpression gave no message: %v", p.Spec.Name, i, r.EvalResult))
		case len(strings.TrimSpace(s)) > celconfig.MaxEvaluatedMessageExpressionSizeBytes:
			dropped = append(dropped, fmt.Sprintf("%s[%d]: messageExpression gave %d bytes, more than the apiserver takes", p.Spec.Name, i, len(s)))
		case strings.Contains(strings.TrimSpace(s), "\n"):
			dropped = append(dropped, fmt.Sprintf("%s[%d]: messageExpression gave more than one line", p.Spec.Name, i))
		}
	}
	return out, dropped
}

func refString(v ref.Val) (string, bool) {
	if v == nil {
		return "", false
	}
	s, ok := v.Value().(string)
	return s, ok
}

// matches is whether p's matchConstraints take req (the shipped policies
// match leases in coordination.k8s.io/v1 by operation only).
func (p *Policy) matches(req Request) bool {
	for _, rule := range p.Spec.Spec.MatchConstraints.ResourceRules {
		if slices.Contains(rule.Operations, admissionregistrationv1.OperationType(req.Operation)) &&
			slices.Contains(rule.Resources, "leases") && slices.Contains(rule.APIGroups, "coordination.k8s.io") {
			return true
		}
	}
	return false
}

// attributes are req's admission attributes, in the form g's target binds
// them, and the namespace object.
func (g *Guard) attributes(req Request) (*admission.VersionedAttributes, *corev1.Namespace) {
	var obj, old runtime.Object
	name, namespace := "", ""
	for _, l := range []*coordinationv1.Lease{req.Old, req.New} {
		if l != nil {
			name, namespace = l.Name, l.Namespace
		}
	}
	if req.New != nil {
		obj = g.object(req.New)
	}
	if req.Old != nil {
		old = g.object(req.Old)
	}
	options := map[admission.Operation]runtime.Object{
		admission.Create: &metav1.CreateOptions{}, admission.Update: &metav1.UpdateOptions{}, admission.Delete: &metav1.DeleteOptions{},
	}[req.Operation]
	attrs := admission.NewAttributesRecord(obj, old, leaseGVK, namespace, name, leaseGVR, "", req.Operation, options, false, req.User)
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: leaseGVK}
	if old != nil {
		va.VersionedOldObject.Set(old)
	}
	if obj != nil {
		va.VersionedObject.Set(obj)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if req.NamespaceDeleting {
		ns.DeletionTimestamp = &metav1.Time{}
	}
	return va, ns
}

// object is l as the target binds it.
func (g *Guard) object(l *coordinationv1.Lease) runtime.Object {
	l = l.DeepCopy()
	l.SetGroupVersionKind(leaseGVK)
	if !g.Target.Unstructured {
		return l
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
	if err != nil {
		panic(fmt.Sprintf("converting a lease: %v", err))
	}
	return &unstructured.Unstructured{Object: u}
}

// authz allows the verbs on distributedlocks and nothing else.
type authz []string

func (a authz) Authorize(_ context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	if attrs.GetAPIGroup() == "locks.frontdesk.dev" && attrs.GetResource() == "distributedlocks" && slices.Contains(a, attrs.GetVerb()) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
}

// Probe is an expression evaluated over a policy's variables, to read what
// the guard reads (a number, the places it counts) and compare it with Go.
type Probe struct {
	policy *Policy
	eval   plugincel.ConditionEvaluator
	expr   string
}

// Probe compiles expr in p's environment, with its variables.
func (p *Policy) Probe(expr string) (*Probe, error) {
	e := expression{expr: expr, types: []*celgo.Type{celgo.AnyType}}
	if r := p.compiler.CompileCELExpression(e, p.vars, environment.StoredExpressions); r.Error != nil {
		return nil, fmt.Errorf("probe %q: %w", expr, r.Error)
	}
	return &Probe{policy: p, eval: p.compiler.CompileCondition([]plugincel.ExpressionAccessor{e}, p.vars, environment.StoredExpressions), expr: expr}, nil
}

// Eval evaluates the probe on req, as Go values (lists as []any, maps as
// map[string]any, optionals as *any).
func (g *Guard) Eval(pr *Probe, req Request) (any, error) {
	attr, ns := g.attributes(req)
	request := plugincel.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(leaseGVR), metav1.GroupVersionKind(leaseGVK))
	results, _, err := pr.eval.ForInput(context.Background(), attr, request,
		plugincel.OptionalVariableBindings{Authorizer: authz(req.Allowed)}, plugincel.CreateNamespaceObject(ns), celconfig.RuntimeCELCostBudget)
	if err != nil {
		return nil, err
	}
	if results[0].Error != nil {
		return nil, results[0].Error
	}
	return native(results[0].EvalResult)
}

// native converts a CEL value to Go.
func native(v ref.Val) (any, error) {
	switch v := v.(type) {
	case *types.Optional:
		if !v.HasValue() {
			return (*any)(nil), nil
		}
		inner, err := native(v.GetValue())
		return &inner, err
	case traits.Lister:
		var out []any
		for it := v.Iterator(); it.HasNext() == types.True; {
			e, err := native(it.Next())
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	case traits.Mapper:
		out := map[string]any{}
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			e, err := native(v.Get(k))
			if err != nil {
				return nil, err
			}
			out[fmt.Sprint(k.Value())] = e
		}
		return out, nil
	case types.Int:
		return int64(v), nil
	case types.String:
		return string(v), nil
	case types.Bool:
		return bool(v), nil
	case *types.Err:
		return nil, v
	}
	raw, err := json.Marshal(v.Value())
	if err != nil {
		return nil, fmt.Errorf("converting %v (%s): %w", v, v.Type(), err)
	}
	var out any
	return out, json.Unmarshal(raw, &out)
}
