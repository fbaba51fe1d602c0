# Embark's build, test and generation targets. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
TOOLS_BIN := $(BIN)/tools
TESTENV_BIN := $(BIN)/testenv

CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN := $(TOOLS_BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
# protoc-gen-go matches the google.golang.org/protobuf runtime in go.mod.
PROTOC_GEN_GO_VERSION := $(shell go list -m -f '{{.Version}}' google.golang.org/protobuf)
PROTOC_GEN_GO := $(TOOLS_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
PROTOC_GEN_GO_GRPC := $(TOOLS_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)
# golangci-lint (make lint, part of make verify), configured in .golangci.yml.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(TOOLS_BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
PROTO_FILES := $(shell git ls-files --cached --others --exclude-standard -- '*.proto')

GO_TEST_FLAGS ?= -race -count=1
# Test-only modules of their own (their heavy dependencies stay out of the
# main go.mod; `go test ./...` at the root does not enter them): the
# manifests' tests (kustomize, kubeconform, Prometheus TSDB/PromQL) and the
# Helm chart's renderer (Helm's Go SDK).
TEST_MODULES := manifests manifests/charts/embark/render
# Integration tests find the kube-apiserver and etcd binaries here.
export KUBEBUILDER_ASSETS := $(TESTENV_BIN)

# The release version, in one place: the VERSION file. Manifests, the Helm
# chart and the image name it (manifests/chart_test.go checks they agree).
VERSION ?= $(shell cat $(ROOT)/VERSION)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The only place build identity is stamped (make build, packages, image).
VERSION_LDFLAGS := -X github.com/embark-mesh/embark/version.version=$(VERSION) -X github.com/embark-mesh/embark/version.revision=$(REVISION)

CRD_DIR := api/crds
CHART_DIR := manifests/charts/embark
# Checksums of every generated file, to tell whether `make generate` changed any
# (the chart's copies of the CRDs, alerts and dashboard included).
GENERATED_SUM := find api onboarding $(CHART_DIR)/crds $(CHART_DIR)/files -name 'zz_generated*.go' -o -name '*.pb.go' -o -path 'api/crds/*.yaml' -o -path '$(CHART_DIR)/*' -type f | LC_ALL=C sort | xargs sha256sum

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Run

.PHONY: demo
demo: testenv ## Run Embark locally: control plane, endpoint, simulated EC2 VMs onboarding.
	go run ./test/demo

##@ Build

.PHONY: build
build: ## Build every package and the binaries under cmd/ into bin/.
	go build ./...
	@if compgen -G "cmd/*/main.go" >/dev/null; then GOBIN=$(BIN) go install -ldflags "$(VERSION_LDFLAGS)" ./cmd/...; fi

.PHONY: generate
generate: $(CONTROLLER_GEN) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Regenerate deepcopy, CRD YAML and protobuf/gRPC code.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:artifacts:config=$(CRD_DIR)
	@# The Helm chart ships copies (a chart cannot reach outside its directory).
	rm -f $(CHART_DIR)/crds/*.yaml && cp $(CRD_DIR)/*.onboarding.tetrate.io_*.yaml $(CHART_DIR)/crds/
	cp manifests/monitoring/prometheusrule.yaml manifests/monitoring/dashboard.json $(CHART_DIR)/files/
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
	protoc -I . -I /usr/include \
		--plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=. --go_opt=module=github.com/embark-mesh/embark \
		--plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GO_GRPC) --go-grpc_out=. --go-grpc_opt=module=github.com/embark-mesh/embark \
		$(PROTO_FILES)

.PHONY: verify
verify: $(GOLANGCI_LINT) ## Fail when generated files are stale, code is not gofmt-clean, go vet or golangci-lint (the layering of docs/architecture.md included) complains, a go.mod is not tidy, or git tracks a binary or a file over 2 MiB.
	@before=$$($(GENERATED_SUM)); \
		$(MAKE) --no-print-directory generate >/dev/null; \
		after=$$($(GENERATED_SUM)); \
		if [ "$$before" != "$$after" ]; then \
			diff <(echo "$$before") <(echo "$$after") >&2 || true; \
			echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; fi
	@unformatted=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	go vet ./...
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && go vet ./...;)
	$(GOLANGCI_LINT) run --timeout 20m ./...
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && $(GOLANGCI_LINT) run --timeout 20m ./...;)
	@# go.mod and go.sum tidy in every module (a test module replaces the main
	@# one: a change of the main go.mod needs its go.mod updated too).
	$(foreach m,. $(TEST_MODULES),cd $(ROOT)/$(m) && go mod tidy -diff >/dev/null || { echo "go.mod of $(m) is not tidy: run 'go mod tidy' there and commit" >&2; exit 1; };)
	@test/tools/check-tracked-files.sh

# Sets the version in every place that names it (VERSION, the chart's
# version and appVersion, the kustomize base's and the IstioOperator
# overlay's image tag, docs/install.md); manifests/version_test.go checks
# they agree.
.PHONY: set-version
set-version: ## Set the release version everywhere: make set-version V=0.2.0 (or V=v0.2.0-rc.1).
	@test -n "$(V)" || { echo "usage: make set-version V=x.y.z" >&2; exit 2; }
	test/tools/set-version.sh $(ROOT) $(V)

##@ Packages

# nfpm builds the packages; its version is pinned in test/tools/nfpm/go.mod.
NFPM_VERSION := v2.45.2
NFPM := $(TOOLS_BIN)/nfpm-$(NFPM_VERSION)
# DEB/RPM versions have no leading v.
PACKAGE_VERSION ?= $(patsubst v%,%,$(VERSION))
PACKAGE_ARCHES ?= amd64 arm64
OUTPUT := $(ROOT)/_output
# The armored OpenPGP private key the packages are signed with (the local
# repository's key, docs/local-repository.md). Unset: a throwaway test key,
# generated once in _output/test-signing-key/.
PACKAGE_SIGNING_KEY ?=
TEST_SIGNING_KEY := $(OUTPUT)/test-signing-key/signing.asc
SIGNING_KEY := $(or $(PACKAGE_SIGNING_KEY),$(TEST_SIGNING_KEY))

.PHONY: packages
packages: $(NFPM) ## Build and sign the onboarding-agent DEB and RPM packages (amd64, arm64) into _output/packages/, read them back, install, upgrade and remove them in a throwaway root, install them with apt-get and dnf from the endpoint's signed repository.
	@if [ -z "$(PACKAGE_SIGNING_KEY)" ]; then \
		echo "packages: PACKAGE_SIGNING_KEY unset: signing with a throwaway test key ($(TEST_SIGNING_KEY))"; \
		onboarding/agent/packaging/test-signing-key.sh $(dir $(TEST_SIGNING_KEY)); fi
	for arch in $(PACKAGE_ARCHES); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch go build -trimpath -ldflags "-s -w $(VERSION_LDFLAGS)" \
			-o $(OUTPUT)/bin/linux_$$arch/onboarding-agent ./cmd/onboarding-agent; \
		mkdir -p $(OUTPUT)/staging && cp $(OUTPUT)/bin/linux_$$arch/onboarding-agent $(OUTPUT)/staging/onboarding-agent; \
		for fmt in deb rpm; do \
			mkdir -p $(OUTPUT)/packages/$$fmt/$$arch; \
			ARCH=$$arch VERSION=$(PACKAGE_VERSION) NFPM_SIGNING_KEY_FILE=$(SIGNING_KEY) \
				$(NFPM) package --config onboarding/agent/packaging/nfpm.yaml --packager $$fmt \
				--target $(OUTPUT)/packages/$$fmt/$$arch/onboarding-agent.$$fmt; \
		done; \
	done
	onboarding/agent/packaging/check.sh $(OUTPUT)/packages
	onboarding/agent/packaging/install-test.sh $(OUTPUT)/packages $(NFPM) $(PACKAGE_VERSION)
	onboarding/agent/packaging/signature-check.sh $(OUTPUT)/packages $(SIGNING_KEY)
	PACKAGES_DIR=$(OUTPUT)/packages PACKAGE_SIGNING_KEY=$(SIGNING_KEY) \
		go test -tags packages -count=1 -v -run '^TestSignedRepository' ./onboarding/agent/integration/

$(NFPM):
	mkdir -p $(TOOLS_BIN)
	cd test/tools/nfpm && go build -o $@ github.com/goreleaser/nfpm/v2/cmd/nfpm

##@ Image

# The onboarding-endpoint image: built by test/tools/image (its own module,
# go-containerregistry), no Docker daemon, no registry. VERSION, REVISION and
# VERSION_LDFLAGS are the release identity set once above. Every timestamp in
# the image is SOURCE_DATE_EPOCH (default: the last commit's time).
IMAGE_NAME ?= embark-mesh/onboarding-endpoint
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_OUTPUT := $(OUTPUT)/image
# IMAGE_COLD_REBUILD=1: the rebuild compiles every package into an empty Go
# build cache (as costly as the first build on a fresh machine) instead of
# reusing the first build's compiled packages; see docs/install.md.
IMAGE_COLD_REBUILD ?=
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

# The image carries the agent's packages of both architectures (the local
# repository's default directory): `make packages` builds them when they
# are missing; run it again after changing the agent.
IMAGE_PACKAGES := $(foreach fmt,deb rpm,$(foreach arch,amd64 arm64,$(OUTPUT)/packages/$(fmt)/$(arch)/onboarding-agent.$(fmt)))

$(IMAGE_PACKAGES) &:
	$(MAKE) packages

.PHONY: image
image: $(IMAGE_PACKAGES) ## Build the onboarding-endpoint image (OCI index, linux/amd64 + linux/arm64, SBOM, the agent's packages) into _output/image/; rebuild it to compare digests; run its entrypoint.
	cd test/tools/image && go run . -module-dir $(ROOT) -o $(IMAGE_OUTPUT) -name $(IMAGE_NAME) \
		-version $(VERSION) -revision $(REVISION) -ldflags "$(VERSION_LDFLAGS)" \
		-platforms $(IMAGE_PLATFORMS) -source-date-epoch $(SOURCE_DATE_EPOCH) \
		-packages $(OUTPUT)/packages \
		$(if $(wildcard $(ROOT)/LICENSE),-license-file $(ROOT)/LICENSE)
	cd test/tools/image && EMBARK_IMAGE_DIR=$(IMAGE_OUTPUT) EMBARK_IMAGE_COLD_REBUILD=$(IMAGE_COLD_REBUILD) go test -count=1 -timeout 30m -v ./...

##@ Release

# The release signing key: a cosign-format key (`cosign generate-key-pair`,
# its password in COSIGN_PASSWORD) or a PEM EC P-256 private key file.
# Unset: a throwaway key, generated once in _output/test-signing-key/.
RELEASE_SIGNING_KEY ?=
TEST_RELEASE_KEY := $(OUTPUT)/test-signing-key/release.key
RELEASE_OUTPUT := $(OUTPUT)/release/$(VERSION)

.PHONY: release
release: ## Write the release into _output/release/<version>/ from the outputs of make image and make packages (run those first; nothing is rebuilt): chart package, image archive, DEB/RPM packages, SBOMs, SHA256SUMS, cosign-format signatures; verify it offline with openssl and sha256sum -c.
	@if [ -z "$(RELEASE_SIGNING_KEY)" ]; then \
		echo "release: RELEASE_SIGNING_KEY unset: signing with a THROWAWAY key ($(TEST_RELEASE_KEY)); do not publish these signatures"; fi
	cd test/tools/release && go run . -o $(RELEASE_OUTPUT) -version $(VERSION) -revision $(REVISION) \
		-chart $(ROOT)/$(CHART_DIR) -image-dir $(IMAGE_OUTPUT) -image-name $(IMAGE_NAME) \
		-packages-dir $(OUTPUT)/packages -packages-signing-key $(SIGNING_KEY) -bin-dir $(OUTPUT)/bin -arches "$(PACKAGE_ARCHES)" \
		-source-date-epoch $(SOURCE_DATE_EPOCH) \
		$(if $(RELEASE_SIGNING_KEY),-key $(RELEASE_SIGNING_KEY),-throwaway-key $(TEST_RELEASE_KEY))
	cd test/tools/release && EMBARK_RELEASE_DIR=$(RELEASE_OUTPUT) go test -count=1 -v ./...

##@ Install test

# The end-to-end install test (test/install, build tag install): the chart
# rendered with the README's `helm install` values and applied to the real
# API server, the endpoint run from `make image`'s image in runc, the VM
# side following docs/vm-install.md. It uses the outputs of `make packages`
# and `make image` (build them first; point these at another build's
# outputs to reuse them) and needs root (network namespaces, runc).
EMBARK_IMAGE_DIR ?= $(IMAGE_OUTPUT)
PACKAGES_DIR ?= $(OUTPUT)/packages

.PHONY: install-test
install-test: testenv ## Run the end-to-end install test (root; after make packages and make image): the chart installed as the README says, the endpoint from the image in runc, a VM following docs/vm-install.md.
	@test -f $(EMBARK_IMAGE_DIR)/layout/index.json || { echo "install-test: no image in $(EMBARK_IMAGE_DIR): run make image first"; exit 1; }
	@test -d $(PACKAGES_DIR) || { echo "install-test: no packages in $(PACKAGES_DIR): run make packages first"; exit 1; }
	EMBARK_IMAGE_DIR=$(EMBARK_IMAGE_DIR) PACKAGES_DIR=$(PACKAGES_DIR) PACKAGE_SIGNING_KEY=$(SIGNING_KEY) \
		go test -tags install -count=1 -timeout 30m -v ./test/install/

##@ Test

.PHONY: testenv
testenv: ## Build the real kube-apiserver, etcd, kube-controller-manager, pilot-agent and istioctl used by tests; unpack Debian's systemd-resolved for the VM resolver tests.
	TESTENV_BIN=$(TESTENV_BIN) test/tools/install.sh
	TESTENV_BIN=$(TESTENV_BIN) test/tools/resolved.sh

.PHONY: test
test: testenv ## Run all tests (unit and integration against a real control plane), the manifests' and the chart's included.
	go test $(GO_TEST_FLAGS) ./...
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && go test $(GO_TEST_FLAGS) ./...;)

.PHONY: manifests
manifests: testenv ## Build, validate and dry-run apply manifests/ and the Helm chart; run the endpoint as its ServiceAccount; test metrics, dashboard and alerts.
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && go test $(GO_TEST_FLAGS) ./...;)

.PHONY: dashboard-images
dashboard-images: testenv ## Render every dashboard panel from a real standalone and istiod-mode run to docs/images/dashboard/*.svg (the test fails on a panel without data).
	rm -rf $(ROOT)/docs/images/dashboard && mkdir -p $(ROOT)/docs/images/dashboard
	cd $(ROOT)/manifests && EMBARK_DASHBOARD_IMAGES=$(ROOT)/docs/images/dashboard go test -count=1 -run '^TestEveryPanelHasDataAndRenders$$' .

.PHONY: e2e
e2e: faults ## Run the end-to-end suite (the fault suite).

.PHONY: faults
FAULTS_STREAMS ?= 1000
faults: testenv ## Run the fault suite at FAULTS_STREAMS streams (1,000): real endpoint processes, restarts and kills, apiserver and etcd outages.
	FAULTS_STREAMS=$(FAULTS_STREAMS) go test -tags faults -count=1 -timeout 30m -v ./test/faults/

.PHONY: bench
BENCH_COUNT ?= 1
BENCH_MAX_LOAD ?= 3
bench: testenv ## Run every benchmark in benchmarks/ BENCH_COUNT times, one at a time (figures above load BENCH_MAX_LOAD refused); write benchmarks/results/<date>.md and .json.
	go run ./benchmarks/cmd/report -count $(BENCH_COUNT) -max-load $(BENCH_MAX_LOAD) ./benchmarks/...

.PHONY: fuzz
FUZZTIME ?= 10s
fuzz: ## Run every Fuzz* target of the repository for FUZZTIME each.
	FUZZTIME=$(FUZZTIME) test/fuzz/run.sh

.PHONY: soak
SOAK_DURATION ?= 10m
SOAK_SIDECARS ?= 1000
soak: testenv ## Two soaks of SOAK_DURATION each: standalone churn with a replica roll; istiod mode with SOAK_SIDECARS sidecars renewing short certificates, a replica roll and an istiod restart. Heap and goroutines flat, nothing lost.
	SOAK_DURATION=$(SOAK_DURATION) SOAK_SIDECARS=$(SOAK_SIDECARS) go test -tags soak -count=1 -timeout 0 -v ./test/soak/

.PHONY: soak-short
soak-short: testenv ## Both soaks briefly (CI): 75s each, 100 sidecars in istiod mode; the same checks over a short window.
	SOAK_DURATION=75s SOAK_SIDECARS=100 go test -tags soak -count=1 -timeout 10m -v ./test/soak/

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run gofmt, go vet and golangci-lint (.golangci.yml: the layering rules, staticcheck, unused, revive, ...).
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi
	go vet ./...
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && go vet ./...;)
	$(GOLANGCI_LINT) run --timeout 20m ./...
	$(foreach m,$(TEST_MODULES),cd $(ROOT)/$(m) && $(GOLANGCI_LINT) run --timeout 20m ./...;)

$(GOLANGCI_LINT):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLS_BIN)/golangci-lint $@

$(PROTOC_GEN_GO):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	mv $(TOOLS_BIN)/protoc-gen-go $@

$(PROTOC_GEN_GO_GRPC):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	mv $(TOOLS_BIN)/protoc-gen-go-grpc $@

$(CONTROLLER_GEN):
	mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(TOOLS_BIN)/controller-gen $@
