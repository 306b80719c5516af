# frontdesk Makefile. Targets follow the kubebuilder names.

# Image to build and deploy.
IMG ?= frontdesk-controller:latest

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
K8S_BIN ?= $(LOCALBIN)/k8s
# The oldest Kubernetes tested: kube-apiserver, etcd and kubectl as 1.33
# shipped them (hack/k8s-binaries-1.33).
K8S_OLDEST_BIN ?= $(LOCALBIN)/k8s-1.33
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
HELM ?= $(LOCALBIN)/helm
PROMTOOL ?= $(LOCALBIN)/promtool
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
KREW_VALIDATE ?= $(LOCALBIN)/validate-krew-manifest
# The kind CLI, in a directory of its own: bin/kind/ is hack/kind's cache.
KIND ?= $(LOCALBIN)/kind-cli/kind
KUBECTL ?= $(K8S_BIN)/kubectl
KUSTOMIZE ?= $(KUBECTL) kustomize

# Go test flags for `make test`; override, e.g. GO_TEST_FLAGS='-run TestLease -v'.
GO_TEST_FLAGS ?=

# The test module (test/go.mod): the suites, the benchmark and the demo, with
# the dependencies only they use. Targets that cover every package run each
# command in the root module, the library's modules, this one and the
# compatibility module.
TEST_MODULE ?= test

# The library's modules: the API types (api/go.mod, apimachinery only) and the
# client library pkg/ (pkg/go.mod), which operators import without the root
# module's requirements. Their floors are checked by `make verify`
# (hack/library-floors.sh against hack/library-floors.txt).
LIBRARY_MODULES ?= api pkg

# The compatibility module (test/compat/go.mod): an operator on the oldest
# Kubernetes stack the library supports (controller-runtime v0.21, client-go
# v0.33), elected through pkg/leaderelection against a real apiserver.
COMPAT_MODULE ?= test/compat

# The examples (examples/go.mod): programs a user copies, with an importer's
# requirements (the pkg module, client-go, SQLite's driver). They have no
# tests of their own: test/integration builds and runs them against a real
# apiserver (examples_test.go, examples_go_test.go).
EXAMPLES_MODULE ?= examples

# The generator of dist/ (hack/dist/go.mod): the install bundles and the Helm
# chart from config/, built into bin/frontdesk-dist by the targets that run it. A module
# of its own, so that kustomize, which it renders config/ with, is no
# requirement of the root module.
DIST_MODULE ?= hack/dist
DIST ?= $(LOCALBIN)/frontdesk-dist

# Every Go module in the repository, as the directories of the go.mod files git
# tracks: the root, the library's, the test and compatibility modules and the
# pinned tool modules under hack/.
GO_MODULES = $(patsubst %/,%,$(dir $(shell git ls-files ':(glob)**/go.mod')))

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9.-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

# controller-gen loads the Go modules nested under a path it is given: it
# takes the API types from api/go.mod and the RBAC markers from controllers/.
# (Not "./...": that walks bin/ too, where the kind node image's root file
# system may hold what it cannot read.)
.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests under config/.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./controllers/..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt (the root, library, test, compatibility, examples and dist generator modules).
	go fmt ./...
	for m in $(LIBRARY_MODULES) $(TEST_MODULE) $(COMPAT_MODULE) $(EXAMPLES_MODULE) $(DIST_MODULE); do (cd $$m && go fmt ./...) || exit 1; done

.PHONY: vet
vet: ## Run go vet (the root, library, test, compatibility, examples and dist generator modules; the e2e suite's build tag too).
	go vet ./...
	for m in $(LIBRARY_MODULES) $(COMPAT_MODULE) $(EXAMPLES_MODULE) $(DIST_MODULE); do (cd $$m && go vet ./...) || exit 1; done
	cd $(TEST_MODULE) && go vet -tags e2e ./...

# Go modules `make lint` checks, as directories: each module that holds
# product or test code, the root, the library's, the test, the
# compatibility and the examples module; override, e.g. LINT_MODULES=test.
LINT_MODULES ?= . $(LIBRARY_MODULES) $(TEST_MODULE) $(COMPAT_MODULE) $(EXAMPLES_MODULE) $(DIST_MODULE)

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	rc=0; for m in $(LINT_MODULES); do \
		echo "golangci-lint: $$m"; \
		(cd $$m && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...) || rc=1; \
	done; exit $$rc

.PHONY: test
test: manifests generate fmt vet k8s-binaries k8s-binaries-1.33 test-alerts ## Run unit and integration tests against a real kube-apiserver and etcd, the security and policy tests against 1.33 too, and the alerts' promtool tests.
	# Build every test binary in parallel, run none (the integration suite's
	# with -race, as it runs), and the examples, which the integration suite
	# runs.
	go test -count=1 -exec true ./...
	for m in $(LIBRARY_MODULES) $(COMPAT_MODULE); do (cd $$m && go test -count=1 -exec true ./...) || exit 1; done
	cd $(EXAMPLES_MODULE) && go build ./...
	cd $(TEST_MODULE) && go test -count=1 -exec true $(TEST_OTHER_PKGS)
	cd $(TEST_MODULE) && go test -race -count=1 -exec true ./integration/
	cd $(TEST_MODULE) && go test -count=1 -exec true ./integration/
	# One package at a time: each starts its own etcd, kube-apiserver and
	# manager, and leases of a few seconds should not lapse because another
	# package's control plane took the CPU (a lapse is correct then, but not
	# what those tests check). The integration suite runs with -race.
	KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./... -p 1 -count=1 -timeout 25m $(GO_TEST_FLAGS)
	for m in $(LIBRARY_MODULES); do (cd $$m && go test ./... -count=1 $(GO_TEST_FLAGS)) || exit 1; done
	$(run-compat)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test -race ./integration/ -skip '$(RACE_SKIP)' -count=1 -timeout 30m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./integration/ -run '$(RACE_SKIP)' -count=1 -timeout 10m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test $(TEST_OTHER_PKGS) -p 1 -count=1 -timeout 25m $(GO_TEST_FLAGS)
	# The lease guard's differential test fuzzed briefly (its seeds and
	# corpus ran with the test module's packages above); FUZZTIME_SHORT=
	# skips it.
	$(if $(FUZZTIME_SHORT),$(call run-fuzz,$(FUZZTIME_SHORT)))
	# The security and policy tests again, against the oldest Kubernetes
	# (without -race: the 1.37 run above had it).
	$(TEST_K8S_OLDEST)

# Integration tests that make test runs without -race: the priority test
# times renewals against a flood of 160 clients that the test process itself
# sends, and the race detector slows both (renewal p99 1.39 s under -race
# against a 1 s bound).
RACE_SKIP = ^TestLeasePriorityKeepsRenewalsOnTime$$

# The test module's packages but the integration suite (which make test
# runs apart, with -race).
TEST_OTHER_PKGS = $(shell cd $(TEST_MODULE) && go list ./... | grep -v -E '/test/integration$$')

# Packages whose tests need no apiserver: pure logic, fake clocks. The root
# module's and the test module's are listed apart (go test takes one module).
UNIT_PKGS = $(shell go list ./... | grep -v -E '/internal/localrun$$')
TEST_UNIT_PKGS = $(shell cd $(TEST_MODULE) && go list ./... | grep -v -E '/test/(integration|chaos|e2e|bench|demo)$$')
# Of those, the lease guard's CEL tests (test/guard, test/guardcost) run
# without -race, as make test runs them: they evaluate the policy's CEL
# programs one at a time, on one goroutine, and the race detector makes
# them minutes instead of seconds.
TEST_UNIT_CEL_PKGS = $(filter %/test/guard %/test/guardcost,$(TEST_UNIT_PKGS))

# test-unit builds nothing first: the generated files are committed, and
# make verify regenerates them and fails on any difference.
.PHONY: test-unit
test-unit: ## Unit tests only: no apiserver, no generation first, with -race but for the lease guard's CEL tests (seconds).
	# The modules' runs go side by side: most of a run is linking test
	# binaries, which one module's go test does a package at a time.
	pids=""; \
	go test -race -count=1 $(UNIT_PKGS) $(GO_TEST_FLAGS) & pids="$$pids $$!"; \
	for m in $(LIBRARY_MODULES); do (cd $$m && go test -race -count=1 ./... $(GO_TEST_FLAGS)) & pids="$$pids $$!"; done; \
	(cd $(TEST_MODULE) && go test -race -count=1 $(filter-out $(TEST_UNIT_CEL_PKGS),$(TEST_UNIT_PKGS)) $(GO_TEST_FLAGS)) & pids="$$pids $$!"; \
	(cd $(TEST_MODULE) && go test -count=1 $(TEST_UNIT_CEL_PKGS) $(GO_TEST_FLAGS)) & pids="$$pids $$!"; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc

# The compatibility test (test/compat): the manager, built from the root
# module, runs as a process of its own against the apiserver the test starts
# with controller-runtime v0.21's envtest.
define run-compat
	go build -o $(LOCALBIN)/manager .
	cd $(COMPAT_MODULE) && FRONTDESK_MANAGER="$(LOCALBIN)/manager" KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./... -count=1 -timeout 5m $(GO_TEST_FLAGS)
endef

.PHONY: test-compat
test-compat: manifests generate k8s-binaries ## The library on controller-runtime v0.21 / client-go v0.33: a short election against a real apiserver (test/compat).
	$(run-compat)

.PHONY: test-integration
test-integration: manifests generate fmt vet k8s-binaries ## Integration tests only (test/integration), real kube-apiserver and etcd, with -race.
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test -race ./integration/ -skip '$(RACE_SKIP)' -count=1 -timeout 30m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./integration/ -run '$(RACE_SKIP)' -count=1 -timeout 10m $(GO_TEST_FLAGS)

# Integration tests that make test also runs against the oldest Kubernetes
# tested (K8S_OLDEST_BIN): who may write a Lease, a lock or a pod, with the
# shipped roles and policies installed (participants_test.go,
# policy_attacks_test.go, guard_attacks_test.go, lapse_attacks_test.go,
# lease_policy_test.go, fencing_policy_test.go, guard_cost_test.go: the
# worst Lease the rules allow), config/default and the
# install bundles applied (deploy_test.go), and the
# lock-admitted pods (admission_test.go, but for
# TestAdmissionGatePolicyGatesAnnotatedPods: config/admission-gate is a
# MutatingAdmissionPolicy, which 1.33 does not serve). Test names, one per
# word; override to narrow, e.g. K8S_OLDEST_TESTS=TestConfigDefaultIsAccepted.
K8S_OLDEST_TESTS ?= \
	TestParticipantCannotWriteItselfInAsHolder TestParticipantCannotChangeTheLeaseDuration \
	TestParticipantCannotReleaseAnothersGrant TestPodsOfOneServiceAccountCannotEndEachOthersGrants \
	TestParticipantCannotJumpTheToken TestQueuePlacesAreBoundToWhoTookThem \
	TestBreakNeedsThePermissionAndFences TestKilledHoldersLockFailsOverToAnotherServiceAccount \
	TestOnlyTheManagerCreatesALocksLease TestExhaustedTokensContinueInANewEpoch \
	TestStockClientGoElectorsOfTwoServiceAccountsTakeTurns \
	TestParticipantCannotRewriteThePrincipalOfAnothersPlace TestHolderCannotForgeAHandOff \
	TestForgedPlaceDoesNotLockAnIdentityOut TestJunkAnnotationsDoNotMakeTheLockUnusable \
	TestQueueFloodDoesNotStarveOthers TestBloatedLeaseDoesNotEndAnothersGrant \
	TestParticipantCannotRegisterAPodsPlace TestHolderCannotMarkItsGrantAHandOffLater \
	TestLapsedHandOffIsNotRenewedBack TestLapsedHandOffIsTakenAnewUnderThePolicy \
	TestDeadPlaceDoesNotLockItsIdentityOutForGood \
	TestLeaseGuardRefusesWritesThatBreakFencing TestLeaseGuardAllowsLocksAndClientGoLeaderElection \
	TestApiserverRejectsStaleWritersOfFencedObjects \
	TestConfigDefaultIsAccepted TestInstallBundlesApply TestManagerRBACIsLeastPrivilege TestLockUserRoleIsEnoughAndNoMore \
	TestGatedPodsAreAdmittedOneAtATimeInCreationOrder TestGatedPodAndKubectlLockRunExcludeEachOther \
	TestAdmittedGrantEndsAtOnceWhenThePodIsProvenFinished TestAdmittedGrantIsWaitedOutWithoutProof \
	TestAdmissionBadInput TestAdmittedCronJobSampleTemplateIsAdmitted \
	TestPlacesOutsideTheGrammarAreRefused TestASeqFarAheadIsRefusedAndWaitersStillRegister \
	TestPodsOfOneServiceAccountCannotFillTheQueue TestUnreadablePlacesAreRemoved \
	TestParticipantWritesNothingTheGuardDoesNotName TestParticipantCannotTamperWithAFreeLock \
	TestLeasesOfANamespaceBeingDeletedMayBeDeleted \
	TestDeletingALocksLeaseNeedsTheBreakVerb TestIdentitiesOutsideTheGrammarAreRefused \
	TestLocksSayWhetherTheLeaseGuardApplies \
	TestPodAdmissionNeedsTheServiceAccountsRights TestAdmittedPodThatNeverStartsIsDeleted \
	TestMarksFollowThePrincipalNotTheIdentity TestCandidatesModeTrustsPrincipalsNotIdentities \
	TestLockAdminRoleBoundClusterWideWritesNoLease TestPodBoundTokensAreThePodsPrincipals \
	TestPlaceNamingNoPodDoesNotStopTheController TestFencedObjectsNameTheirLockWithTheirFirstToken \
	TestWorstLeaseTheGuardAllowsFitsAQuarterOfItsCELBudgets \
	TestPrincipalsOutsideTheGrammarCannotGrantOrQueue \
	TestParticipantsCannotForgeAProof TestProvenDeadHolderFailsOverAtOnce \
	TestProofAttackLockUserCannotForgeThePhasesManager TestProofAttackOnlyNamespaceEditorsMayMintAPodsToken

empty :=
space := $(empty) $(empty)

# Runs K8S_OLDEST_TESTS against K8S_OLDEST_BIN, the suite's kubectl
# included; fails first if a name is no test of test/integration (a renamed
# test would otherwise drop out of the run unseen).
define TEST_K8S_OLDEST
for t in $(K8S_OLDEST_TESTS); do \
	grep -q "^func $$t(" $(TEST_MODULE)/integration/*_test.go || \
		{ echo "K8S_OLDEST_TESTS: $$t is no test of $(TEST_MODULE)/integration" >&2; exit 1; }; \
done
cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_OLDEST_BIN)" go test ./integration/ \
	-run '^($(subst $(space),|,$(strip $(K8S_OLDEST_TESTS))))$$' -count=1 -timeout 10m $(GO_TEST_FLAGS)
endef

.PHONY: test-k8s-1.33
test-k8s-1.33: manifests generate fmt vet k8s-binaries-1.33 ## The security and policy tests of test/integration (K8S_OLDEST_TESTS) against kube-apiserver 1.33.
	$(TEST_K8S_OLDEST)

.PHONY: test-alerts
test-alerts: promtool ## Unit-test config/prometheus's alerts with promtool (alerts_test.yaml).
	mkdir -p $(LOCALBIN)/alerts
	sed -n '/^spec:$$/,$$p' config/prometheus/prometheusrule.yaml | sed '1d; s/^  //' > $(LOCALBIN)/alerts/frontdesk.rules.yaml
	cp config/prometheus/alerts_test.yaml $(LOCALBIN)/alerts/
	$(PROMTOOL) check rules $(LOCALBIN)/alerts/frontdesk.rules.yaml
	$(PROMTOOL) test rules $(LOCALBIN)/alerts/alerts_test.yaml

# The lease guard's differential test (test/guard): each fuzz target there
# (every func Fuzz... of its tests) runs for FUZZTIME in `make fuzz`, for
# FUZZTIME_SHORT in `make test`. A disagreement fails the run and leaves the
# input under test/guard/testdata/fuzz/<target>, which then stays there as
# a seed.
FUZZ_TARGETS ?= $(shell grep -ho '^func Fuzz[A-Za-z0-9_]*' $(TEST_MODULE)/guard/*_test.go | cut -d' ' -f2)
FUZZTIME ?= 5m
FUZZTIME_SHORT ?= 5s

# The fuzz targets' test binary, built once with the fuzzer's
# instrumentation and run once per target (a `go test -fuzz` per target
# would link and vet it each time).
FUZZ_BIN ?= $(LOCALBIN)/guard-fuzz.test

define run-fuzz
@test -n "$(FUZZ_TARGETS)" || { echo "no fuzz targets in $(TEST_MODULE)/guard" >&2; exit 1; }
cd $(TEST_MODULE) && go test -c -fuzz . -o $(FUZZ_BIN) ./guard/
cd $(TEST_MODULE)/guard && for f in $(FUZZ_TARGETS); do \
	echo "$$f for $(1)"; \
	$(FUZZ_BIN) -test.run '^$$' -test.fuzz "^$$f$$" -test.fuzztime $(1) \
		-test.fuzzcachedir "$$(go env GOCACHE)/fuzz/github.com/frontdesk-dev/frontdesk/test/guard" || exit 1; \
done
endef

.PHONY: fuzz
fuzz: ## The lease guard's differential test, long: each fuzz target of test/guard for FUZZTIME (5m each); make test runs them for FUZZTIME_SHORT.
	$(call run-fuzz,$(FUZZTIME))

.PHONY: chaos
chaos: manifests generate k8s-binaries ## Fault suite, long version (the short one runs in make test).
	cd $(TEST_MODULE) && FRONTDESK_CHAOS=long KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./chaos/ -count=1 -timeout 30m -v

# The adversary's long run: how many random writes it sends to a guarded
# lock's Lease, and from which seed (random when empty; the run prints it).
# make test runs a short one (1,000 writes) with the integration suite.
ADVERSARY_WRITES ?= 10000
ADVERSARY_SEED ?=

.PHONY: adversary
adversary: manifests generate k8s-binaries ## Adversary, long run: ADVERSARY_WRITES random writes to a lock's Lease while honest clients use it (ADVERSARY_SEED replays one).
	cd $(TEST_MODULE) && FRONTDESK_ADVERSARY_WRITES=$(ADVERSARY_WRITES) FRONTDESK_ADVERSARY_SEED=$(ADVERSARY_SEED) KUBEBUILDER_ASSETS="$(K8S_BIN)" \
		go test ./integration/ -run '^TestAdversaryCannotMakeALockUnusable$$' -count=1 -timeout 60m -v

# Go test flags for `make test-e2e`, e.g. E2E_FLAGS='-run TestBillingScenario'.
E2E_FLAGS ?=

.PHONY: test-e2e
test-e2e: manifests generate k8s-binaries helm ## Create a 3-node kind cluster from images built here, deploy config/default, run the e2e tests (needs docker; skips without it).
	cd $(TEST_MODULE) && go test -tags e2e ./e2e/ -count=1 -timeout 90m -v $(E2E_FLAGS)

# Images of `make kind-images` (the e2e tests use these names).
E2E_IMG ?= frontdesk-controller:e2e
E2E_PLUGIN_IMG ?= frontdesk-kubectl-dlock:e2e
E2E_DEMO_IMG ?= frontdesk-demo:e2e

.PHONY: kind-node-image
kind-node-image: k8s-binaries ## Build the kind node image from Debian packages and Go modules, with no registry (cached; docs/kind.md).
	hack/kind/build-node-image.sh

.PHONY: kind-images
kind-images: ## Assemble the manager, kubectl-dlock and demo images from Go binaries, with no registry (cached).
	hack/kind/build-images.sh $(E2E_IMG) $(E2E_PLUGIN_IMG) $(E2E_DEMO_IMG)

# The kind cluster of `make kind-cluster` / `make kind-delete`, and its
# workers beside the control plane.
KIND_CLUSTER ?= frontdesk
KIND_WORKERS ?= 1

.PHONY: kind-cluster
kind-cluster: manifests kind kind-node-image kind-images ## A kind cluster KIND_CLUSTER to try frontdesk on, from the images built here (no registry): created unless it exists, images loaded, both install bundles applied with image frontdesk-controller:e2e (hack/kind/cluster.sh).
	KIND="$(KIND)" KUBECTL="$(KUBECTL)" KIND_WORKERS=$(KIND_WORKERS) MANAGER_IMAGE=$(E2E_IMG) PLUGIN_IMAGE=$(E2E_PLUGIN_IMG) DEMO_IMAGE=$(E2E_DEMO_IMG) \
		hack/kind/cluster.sh create $(KIND_CLUSTER)

.PHONY: kind-delete
kind-delete: kind ## Delete the kind cluster KIND_CLUSTER of make kind-cluster.
	KIND="$(KIND)" hack/kind/cluster.sh delete $(KIND_CLUSTER)

.PHONY: verify
verify: manifests generate fmt vet lint build-installer chart-check ## Regenerate everything (the install bundle and the chart too), lint the code and the chart, tidy every Go module, check the library's floors, fail if the tree changed.
	for mod in $(GO_MODULES); do echo "go mod tidy in $$mod"; (cd $$mod && go mod tidy) || exit 1; done
	hack/library-floors.sh --check
	git diff --exit-code

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager and kubectl-dlock binaries into bin/.
	go build -o $(LOCALBIN)/manager .
	go build -o $(LOCALBIN)/kubectl-dlock ./cmd/kubectl-dlock

.PHONY: run
run: manifests generate fmt vet ## Run the manager against the cluster in your kubeconfig.
	go run . --metrics-bind-address=:8080 --metrics-secure=false

.PHONY: local
local: manifests generate k8s-binaries ## Start a local control plane, install the CRD, run the manager and apply a sample lock.
	KUBEBUILDER_ASSETS="$(K8S_BIN)" go run ./cmd/frontdesk-local --assets "$(K8S_BIN)" --sample config/samples/locks_v1alpha1_distributedlock.yaml

# Flags for `make demo`; empty runs the full-size incident (about 7 minutes).
DEMO_FLAGS ?= --fast

.PHONY: demo
demo: manifests generate k8s-binaries ## Run the billing scenario without and with fencing (DEMO_FLAGS= for the full size).
	cd $(TEST_MODULE) && go build -o $(LOCALBIN)/frontdesk-demo ./cmd/frontdesk-demo
	$(LOCALBIN)/frontdesk-demo --assets "$(K8S_BIN)" $(DEMO_FLAGS)

.PHONY: bench
bench: manifests generate k8s-binaries ## Lock latencies, then frontdesk vs etcd Mutex vs Redis side by side, on a local control plane.
	hack/ensure-redis.sh
	cd $(TEST_MODULE) && go build -o $(LOCALBIN)/frontdesk-bench ./cmd/frontdesk-bench
	KUBEBUILDER_ASSETS="$(K8S_BIN)" $(LOCALBIN)/frontdesk-bench $(BENCH_FLAGS)

# `make bench-doc`: the flags of each of its two runs of the bench, and of
# the guard's price that follows each (BENCH_DOC_GUARD_PRICE=off leaves it
# out); the reports go to BENCH_DOC_DIR.
BENCH_DOC_FLAGS ?= --iterations 300 --handoffs 100 --handoff-rounds 2 --waiters 1,50,200 --crowds 20 --failover-trials 10 --proof-trials 10 --admission ""
BENCH_DOC_PRICE_FLAGS ?= --price-iterations 100 --price-handoffs 30 --price-throughput 1s --price-throughput-rounds 4
BENCH_DOC_GUARD_PRICE ?= on
BENCH_DOC_DIR ?= $(LOCALBIN)/bench-doc

.PHONY: bench-doc
bench-doc: manifests generate k8s-binaries ## Run the bench twice (BENCH_DOC_FLAGS, then --guard-price with BENCH_DOC_PRICE_FLAGS) and rewrite docs/benchmarks.md's tables from the two runs (about 20 minutes).
	hack/ensure-redis.sh
	cd $(TEST_MODULE) && go build -o $(LOCALBIN)/frontdesk-bench ./cmd/frontdesk-bench && go build -o $(LOCALBIN)/frontdesk-bench-doc ./cmd/frontdesk-bench-doc
	rm -rf $(BENCH_DOC_DIR) && mkdir -p $(BENCH_DOC_DIR)
	for run in 1 2; do \
		echo "bench-doc: run $$run of 2"; \
		KUBEBUILDER_ASSETS="$(K8S_BIN)" $(LOCALBIN)/frontdesk-bench $(BENCH_DOC_FLAGS) --report $(BENCH_DOC_DIR)/run$$run.json || exit 1; \
		if [ "$(BENCH_DOC_GUARD_PRICE)" = on ]; then \
			KUBEBUILDER_ASSETS="$(K8S_BIN)" $(LOCALBIN)/frontdesk-bench --guard-price $(BENCH_DOC_PRICE_FLAGS) --report $(BENCH_DOC_DIR)/run$$run-price.json || exit 1; \
		fi; \
	done
	KUBEBUILDER_ASSETS="$(K8S_BIN)" $(LOCALBIN)/frontdesk-bench-doc --doc docs/benchmarks.md \
		$(foreach run,1 2,--run $(BENCH_DOC_DIR)/run$(run).json$(if $(filter on,$(BENCH_DOC_GUARD_PRICE)),$(comma)$(BENCH_DOC_DIR)/run$(run)-price.json))

# Image for the kubectl-dlock plugin.
PLUGIN_IMG ?= frontdesk-kubectl-dlock:latest

.PHONY: bench-cost
bench-cost: manifests generate k8s-binaries ## Measure the controller's RSS and status lag with 1,000 and 10,000 locks.
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go run ./cmd/frontdesk-bench --cost 1000,10000 $(BENCH_FLAGS)

.PHONY: docker-build
docker-build: ## Build the manager and kubectl-dlock images (needs a container engine).
	docker build -t $(IMG) .
	docker build -t $(PLUGIN_IMG) -f Dockerfile.kubectl-dlock .

# Version of `make release-artifacts`.
VERSION ?= v0.1.0

.PHONY: release-artifacts
release-artifacts: krew-validator ## kubectl-dlock for linux and darwin (amd64, arm64): tarballs, sha256 sums and the krew manifest in dist/release, checked by krew's validator.
	hack/release.sh $(VERSION)
	$(KREW_VALIDATE) -manifest dist/release/dlock.yaml -skip-install

##@ Deployment

.PHONY: install
install: manifests ## Install the CRD into the cluster in your kubeconfig.
	$(KUSTOMIZE) config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests ## Remove the CRD from the cluster in your kubeconfig.
	$(KUSTOMIZE) config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests ## Deploy the controller to the cluster in your kubeconfig.
	$(KUSTOMIZE) config/default | sed 's|image: controller:latest|image: $(IMG)|' | $(KUBECTL) apply --server-side -f -

.PHONY: build-installer
build-installer: manifests dist-generator ## Write dist/install.yaml (config/default as one file, with the image set by IMG) and dist/install-mutating.yaml (config/mutating, for 1.36 and later) (hack/dist).
	$(DIST) -bundle dist/install.yaml -mutating-bundle dist/install-mutating.yaml -image $(IMG)

.PHONY: dist-generator
dist-generator: ## Build the generator of dist/ (hack/dist, a module of its own) into bin/ (go build: current after any change).
	cd $(DIST_MODULE) && go build -o $(DIST) .

.PHONY: chart
chart: dist-generator ## Write the Helm chart dist/chart from config/ (hack/dist; its default image is IMG).
	$(DIST) -chart dist/chart -image $(IMG)

# The kinds (group/version/Kind) kube-apiserver 1.33 serves with its
# defaults, as its discovery lists them: a 1.33 cluster's capabilities for
# `helm template` in chart-check, which needs no cluster.
K8S_1_33_APIS = \
	admissionregistration.k8s.io/v1/MutatingWebhookConfiguration \
	admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy \
	admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding \
	admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration \
	apiextensions.k8s.io/v1/CustomResourceDefinition apiregistration.k8s.io/v1/APIService \
	apps/v1/ControllerRevision apps/v1/DaemonSet apps/v1/Deployment apps/v1/ReplicaSet apps/v1/StatefulSet \
	authentication.k8s.io/v1/SelfSubjectReview authentication.k8s.io/v1/TokenReview \
	authorization.k8s.io/v1/LocalSubjectAccessReview authorization.k8s.io/v1/SelfSubjectAccessReview \
	authorization.k8s.io/v1/SelfSubjectRulesReview authorization.k8s.io/v1/SubjectAccessReview \
	autoscaling/v1/HorizontalPodAutoscaler autoscaling/v2/HorizontalPodAutoscaler \
	batch/v1/CronJob batch/v1/Job certificates.k8s.io/v1/CertificateSigningRequest \
	coordination.k8s.io/v1/Lease discovery.k8s.io/v1/EndpointSlice events.k8s.io/v1/Event \
	flowcontrol.apiserver.k8s.io/v1/FlowSchema flowcontrol.apiserver.k8s.io/v1/PriorityLevelConfiguration \
	networking.k8s.io/v1/IPAddress networking.k8s.io/v1/Ingress networking.k8s.io/v1/IngressClass \
	networking.k8s.io/v1/NetworkPolicy networking.k8s.io/v1/ServiceCIDR node.k8s.io/v1/RuntimeClass \
	policy/v1/PodDisruptionBudget \
	rbac.authorization.k8s.io/v1/ClusterRole rbac.authorization.k8s.io/v1/ClusterRoleBinding \
	rbac.authorization.k8s.io/v1/Role rbac.authorization.k8s.io/v1/RoleBinding \
	scheduling.k8s.io/v1/PriorityClass \
	storage.k8s.io/v1/CSIDriver storage.k8s.io/v1/CSINode storage.k8s.io/v1/CSIStorageCapacity \
	storage.k8s.io/v1/StorageClass storage.k8s.io/v1/VolumeAttachment \
	v1/Binding v1/ComponentStatus v1/ConfigMap v1/Endpoints v1/Event v1/LimitRange v1/Namespace v1/Node \
	v1/PersistentVolume v1/PersistentVolumeClaim v1/Pod v1/PodTemplate v1/ReplicationController \
	v1/ResourceQuota v1/Secret v1/Service v1/ServiceAccount

# What kube-apiserver 1.37 serves beyond 1.33 (their discoveries compared).
K8S_1_37_APIS = $(K8S_1_33_APIS) \
	admissionregistration.k8s.io/v1/MutatingAdmissionPolicy \
	admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding \
	certificates.k8s.io/v1/ClusterTrustBundle certificates.k8s.io/v1/PodCertificateRequest \
	resource.k8s.io/v1/DeviceClass resource.k8s.io/v1/DeviceTaintRule resource.k8s.io/v1/ResourceClaim \
	resource.k8s.io/v1/ResourceClaimTemplate resource.k8s.io/v1/ResourceSlice \
	storage.k8s.io/v1/VolumeAttributesClass storagemigration.k8s.io/v1/StorageVersionMigration

comma := ,
# A cluster's capabilities for helm template --api-versions: its kinds, and
# their group/versions (as helm reads them from a live cluster's discovery).
api_versions = $(subst $(space),$(comma),$(strip $(1) $(sort $(patsubst %/,%,$(dir $(1))))))

# chart_check,VERSION,APIS,BUNDLES renders the chart's defaults with a
# cluster's version and capabilities, and checks that it is the bundles'
# objects and holds no kind outside APIS (the long lists are not echoed).
define chart_check
@echo '$(HELM) template frontdesk dist/chart --kube-version $(1) --api-versions <$(2)> > $(LOCALBIN)/chart-rendered-$(1).yaml'
@$(HELM) template frontdesk dist/chart --kube-version $(1) --api-versions '$(call api_versions,$($(2)))' > $(LOCALBIN)/chart-rendered-$(1).yaml
@echo '$(DIST) -check $(LOCALBIN)/chart-rendered-$(1).yaml -against $(3) -served <$(2)>'
@$(DIST) -check $(LOCALBIN)/chart-rendered-$(1).yaml -against $(3) -served '$(subst $(space),$(comma),$(strip $($(2))))'
endef

.PHONY: chart-check
chart-check: helm chart build-installer ## helm lint the chart; rendered for 1.37 it must be both install bundles' objects, for 1.33 install.yaml's, each of a kind that version serves.
	$(HELM) lint dist/chart
	$(call chart_check,1.37,K8S_1_37_APIS,dist/install.yaml$(comma)dist/install-mutating.yaml)
	$(call chart_check,1.33,K8S_1_33_APIS,dist/install.yaml)

.PHONY: undeploy
undeploy: ## Remove the controller from the cluster in your kubeconfig.
	$(KUSTOMIZE) config/default | $(KUBECTL) delete --ignore-not-found -f -

##@ Tools

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen (pinned in hack/tools/go.mod).
$(CONTROLLER_GEN): hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: k8s-binaries
k8s-binaries: ## Build kube-apiserver, etcd and kubectl from Go modules into bin/k8s (skipped when current).
	hack/build-k8s-binaries.sh "$(K8S_BIN)"

.PHONY: k8s-binaries-1.33
k8s-binaries-1.33: ## Build kube-apiserver, etcd and kubectl 1.33 from Go modules into bin/k8s-1.33 (skipped when current).
	hack/build-k8s-binaries.sh "$(K8S_OLDEST_BIN)" hack/k8s-binaries-1.33

.PHONY: helm
helm: $(HELM) ## Build helm (pinned in hack/helm/go.mod).
$(HELM): hack/helm/go.mod hack/helm/go.sum
	cd hack/helm && GOBIN=$(LOCALBIN) go install helm.sh/helm/v3/cmd/helm

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool (pinned in hack/promtool/go.mod).
$(PROMTOOL): hack/promtool/go.mod hack/promtool/go.sum
	cd hack/promtool && GOBIN=$(LOCALBIN) go install github.com/prometheus/prometheus/cmd/promtool

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint (pinned in hack/golangci-lint/go.mod).
$(GOLANGCI_LINT): hack/golangci-lint/go.mod hack/golangci-lint/go.sum
	cd hack/golangci-lint && GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: kind
kind: $(KIND) ## Build the kind CLI into bin/kind-cli/ (sigs.k8s.io/kind as test/go.mod pins it, the version of hack/kind's node image files and of the e2e test).
$(KIND): test/go.mod test/go.sum
	cd test && GOBIN=$(dir $(KIND)) go install sigs.k8s.io/kind

.PHONY: krew-validator
krew-validator: $(KREW_VALIDATE) ## Build krew's plugin manifest validator (pinned in hack/krew/go.mod).
$(KREW_VALIDATE): hack/krew/go.mod hack/krew/go.sum
	cd hack/krew && GOBIN=$(LOCALBIN) go install sigs.k8s.io/krew/cmd/validate-krew-manifest
