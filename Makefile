# gpuherd: `make run` starts the agent on a simulated DGX H100, `make test` runs the tests.
GO         ?= go
# go-nvml's cgo header is full of deprecation warnings that say nothing about us.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# -z lazy: the binary must start on hosts without libnvidia-ml (NVML is dlopened).
COMMIT     ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS    := -X github.com/gpuherd/gpuherd/agent.Version=$(VERSION) -X github.com/gpuherd/gpuherd/agent.Commit=$(COMMIT) -extldflags=-Wl,-z,lazy
BIN        := bin/gpuherd
# The DRA kubelet plugin, a binary of its own (`gpuherd kubelet-plugin`
# runs it from gpuherd's directory): the agent links no Kubernetes code.
PLUGIN_BIN := $(dir $(BIN))gpuherd-kubelet-plugin
RUN_DIR    := $(CURDIR)/.run
PROFILE    ?= dgx-h100
METRICS_PORT ?= 9465

.PHONY: all build run demo demo-kubevirt test test-short test-integration test-kernel test-dst test-faults test-kube fuzz cover tidy-check bench bench-micro lint fmt clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/gpuherd
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(PLUGIN_BIN) ./cmd/gpuherd-kubelet-plugin

# The agent on simulated hardware, state in .run/ (it survives restarts, as a
# real machine does; `make clean` forgets it). Free GPUs go back to nvidia so
# that claims and releases visibly move them.
run: build
	@mkdir -p $(RUN_DIR)
	@echo "gpuherd agent on a simulated $(PROFILE); state in $(RUN_DIR)/data"
	@echo "In another shell:"
	@echo "  export GPUHERD_SOCKET=$(RUN_DIR)/gpuherd.sock"
	@echo "  $(CURDIR)/$(BIN) status"
	@echo "  $(CURDIR)/$(BIN) claim vm-1 --gpu \"H100 80GB:2\""
	@echo "  $(CURDIR)/$(BIN) release vm-1"
	@echo "  curl -s localhost:$(METRICS_PORT)/metrics | grep ^gpuherd_"
	@echo
	exec $(BIN) agent --simulate $(PROFILE) --node-name sim-$(PROFILE) \
		--data-dir $(RUN_DIR)/data --socket $(RUN_DIR)/gpuherd.sock --idle-driver nvidia \
		--metrics-addr 127.0.0.1:$(METRICS_PORT)

# Four agents on simulated servers with TLS and a gossip key, and a scripted
# scenario with a readable transcript (tools/cmd/gpuherd-demo).
demo: build
	cd tools && $(GO) build -o ../bin/gpuherd-demo ./cmd/gpuherd-demo
	bin/gpuherd-demo --gpuherd $(BIN)

# KubeVirt without a cluster: an in-process kube-apiserver, kube-scheduler
# and resourceclaim controller, two simulated hypervisors with their agents
# and DRA plugins, a VM's claim, allocation, prepare, metadata and release
# (tools/kube; docs/kubevirt.md). The first build takes minutes.
demo-kubevirt:
	cd tools/kube && $(GO) run ./cmd/gpuherd-kubevirt-demo

# The DRA driver against a real control plane (tools/kube, a module of its
# own: the product's go.mod never carries k8s.io/kubernetes).
test-kube:
	cd tools/kube && $(GO) test -count=1 ./...

# Every test of both modules (the agent's and tools/), with the race detector.
test:
	$(GO) test -race -count=1 ./...
	cd tools && $(GO) test -race -count=1 ./...

# Unit tests and the in-memory protocol tests (agents talking through
# agent/claimtest and gossip/gossiptest); the TestIntegration tests, which
# start agents on real sockets with TLS, and whole processes skip.
test-short:
	$(GO) test -short -count=1 ./...

# The tests that start real agents (mutual TLS, memberlist on loopback)
# and whole processes, with the race detector.
test-integration:
	$(GO) test -race -count=1 -run '^TestIntegration|^TestProcess|^TestAgentSpeaksSystemdNotify' ./agent/... ./cmd/...

# Every fuzz target for FUZZTIME (10 s) each; see docs/testing.md.
fuzz:
	.ci/fuzz.sh

# Test coverage of the agent's module, per function, into cover.out.
cover:
	$(GO) test -short -count=1 -coverprofile=cover.out ./...
	$(GO) tool cover -func=cover.out | tail -1

# go.mod and go.sum of both modules are tidy.
tidy-check:
	$(GO) mod tidy -diff
	cd tools && $(GO) mod tidy -diff
	cd tools/kube && $(GO) mod tidy -diff

# vfio on a real kernel: Debian's cloud kernel under QEMU (TCG, emulated
# IOMMU), the agent included. See tools/test/realkernel/run.sh.
test-kernel:
	GO=$(GO) tools/test/realkernel/run.sh

# The deterministic simulation of the claim protocol with the name
# registry, on the agent's real roles: DST_SCHEDULES seeded fault
# schedules (10,000, two at a time, about 10 minutes on 2 cores); a
# failing one prints DST_SEED=n to replay it. See docs/names.md,
# "Simulation".
DST_SCHEDULES ?= 10000
test-dst:
	DST_SCHEDULES=$(DST_SCHEDULES) $(GO) test -timeout 60m -count=1 -v -run '^TestSimulation$$' ./agent/internal/dst

# Faults across servers (root, Linux): agents in network namespaces, kill -9,
# SIGSTOP, partitions and packet loss from fixed seeds; see docs/testing.md.
test-faults:
	.ci/faults.sh

# Claim speed, convergence and placement against etcd, an oracle and other
# rankings (needs Debian's etcd-server for the etcd rows); see BENCHMARKS.md.
bench:
	cd tools && $(GO) build -o ../bin/gpuherd-bench ./cmd/gpuherd-bench
	bin/gpuherd-bench

bench-micro:
	$(GO) test -run '^$$' -bench . ./agent ./agent/ledger ./agent/placement ./gossip ./metrics

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd tools && $(GO) vet ./...
	cd tools/kube && $(GO) vet ./...
	$(GO) tool staticcheck ./...
	cd tools && $$($(GO) -C .. tool -n staticcheck) ./...
	cd tools/kube && $$($(GO) -C ../.. tool -n staticcheck) ./...
	$(GO) test -count=1 ./internal/layers

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin .run dist cover.out

include packaging.mk
