# frontdesk Makefile. Targets follow the kubebuilder names.

# Image to build and deploy.
IMG ?= frontdesk-controller:latest

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
K8S_BIN ?= $(LOCALBIN)/k8s
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
HELM ?= $(LOCALBIN)/helm
PROMTOOL ?= $(LOCALBIN)/promtool
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
KREW_VALIDATE ?= $(LOCALBIN)/validate-krew-manifest
KUBECTL ?= $(K8S_BIN)/kubectl
KUSTOMIZE ?= $(KUBECTL) kustomize

# Go test flags for `make test`; override, e.g. GO_TEST_FLAGS='-run TestLease -v'.
GO_TEST_FLAGS ?=

# The test module (test/go.mod): the suites, the benchmark and the demo, with
# the dependencies only they use. Targets that cover every package run each
# command in the root module and then in this one.
TEST_MODULE ?= test

# Every Go module in the repository, as the directories of the go.mod files git
# tracks: the root, the test module and the pinned tool modules under hack/.
GO_MODULES = $(patsubst %/,%,$(dir $(shell git ls-files ':(glob)**/go.mod')))

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests under config/.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt (both modules).
	go fmt ./...
	cd $(TEST_MODULE) && go fmt ./...

.PHONY: vet
vet: ## Run go vet (both modules; the e2e suite's build tag too).
	go vet ./...
	cd $(TEST_MODULE) && go vet -tags e2e ./...

# Go modules `make lint` checks, as directories: each module that holds
# product or test code, the root and the test module; override, e.g.
# LINT_MODULES=test.
LINT_MODULES ?= . $(TEST_MODULE)

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	rc=0; for m in $(LINT_MODULES); do \
		echo "golangci-lint: $$m"; \
		(cd $$m && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...) || rc=1; \
	done; exit $$rc

.PHONY: test
test: manifests generate fmt vet k8s-binaries test-alerts ## Run unit and integration tests against a real kube-apiserver and etcd, and the alerts' promtool tests.
	# Build every test binary in parallel, run none (the integration suite's
	# with -race, as it runs).
	go test -count=1 -exec true ./...
	cd $(TEST_MODULE) && go test -count=1 -exec true $(TEST_OTHER_PKGS)
	cd $(TEST_MODULE) && go test -race -count=1 -exec true ./integration/
	cd $(TEST_MODULE) && go test -count=1 -exec true ./integration/
	# One package at a time: each starts its own etcd, kube-apiserver and
	# manager, and leases of a few seconds should not lapse because another
	# package's control plane took the CPU (a lapse is correct then, but not
	# what those tests check). The integration suite runs with -race.
	KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./... -p 1 -count=1 -timeout 25m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test -race ./integration/ -skip '$(RACE_SKIP)' -count=1 -timeout 30m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./integration/ -run '$(RACE_SKIP)' -count=1 -timeout 10m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test $(TEST_OTHER_PKGS) -p 1 -count=1 -timeout 25m $(GO_TEST_FLAGS)

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

.PHONY: test-unit
test-unit: manifests generate fmt vet ## Unit tests only: no apiserver, with -race (seconds).
	go test -race -count=1 $(UNIT_PKGS) $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && go test -race -count=1 $(TEST_UNIT_PKGS) $(GO_TEST_FLAGS)

.PHONY: test-integration
test-integration: manifests generate fmt vet k8s-binaries ## Integration tests only (test/integration), real kube-apiserver and etcd, with -race.
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test -race ./integration/ -skip '$(RACE_SKIP)' -count=1 -timeout 30m $(GO_TEST_FLAGS)
	cd $(TEST_MODULE) && KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./integration/ -run '$(RACE_SKIP)' -count=1 -timeout 10m $(GO_TEST_FLAGS)

.PHONY: test-alerts
test-alerts: promtool ## Unit-test config/prometheus's alerts with promtool (alerts_test.yaml).
	mkdir -p $(LOCALBIN)/alerts
	sed -n '/^spec:$$/,$$p' config/prometheus/prometheusrule.yaml | sed '1d; s/^  //' > $(LOCALBIN)/alerts/frontdesk.rules.yaml
	cp config/prometheus/alerts_test.yaml $(LOCALBIN)/alerts/
	$(PROMTOOL) check rules $(LOCALBIN)/alerts/frontdesk.rules.yaml
	$(PROMTOOL) test rules $(LOCALBIN)/alerts/alerts_test.yaml

.PHONY: chaos
chaos: manifests generate k8s-binaries ## Fault suite, long version (the short one runs in make test).
	cd $(TEST_MODULE) && FRONTDESK_CHAOS=long KUBEBUILDER_ASSETS="$(K8S_BIN)" go test ./chaos/ -count=1 -timeout 30m -v

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

.PHONY: verify
verify: manifests generate fmt vet lint build-installer chart-check ## Regenerate everything (the install bundle and the chart too), lint the code and the chart, tidy every Go module, fail if the tree changed.
	for mod in $(GO_MODULES); do echo "go mod tidy in $$mod"; (cd $$mod && go mod tidy) || exit 1; done
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
build-installer: manifests ## Write dist/install.yaml: config/default as one file, with the image set by IMG (hack/dist).
	go run ./hack/dist -bundle dist/install.yaml -image $(IMG)

.PHONY: chart
chart: ## Write the Helm chart dist/chart from config/ (hack/dist; its default image is IMG).
	go run ./hack/dist -chart dist/chart -image $(IMG)

.PHONY: chart-check
chart-check: helm chart build-installer ## helm lint and helm template the chart; its defaults must render the install bundle's objects.
	$(HELM) lint dist/chart
	$(HELM) template frontdesk dist/chart > $(LOCALBIN)/chart-rendered.yaml
	go run ./hack/dist -check $(LOCALBIN)/chart-rendered.yaml -against dist/install.yaml

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

.PHONY: krew-validator
krew-validator: $(KREW_VALIDATE) ## Build krew's plugin manifest validator (pinned in hack/krew/go.mod).
$(KREW_VALIDATE): hack/krew/go.mod hack/krew/go.sum
	cd hack/krew && GOBIN=$(LOCALBIN) go install sigs.k8s.io/krew/cmd/validate-krew-manifest
