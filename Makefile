# Tether — build, test and packaging entry points.
#
# `make help` lists the targets; each documented target has a `## ` comment.
# `make test` is the one test command: CI (.ci/run) and the README call it.
# Nothing here needs the network except the Go module proxy (go downloads);
# the docker targets build from local files only (there may be no registry).

SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/tetherfleet/tether/cmd/tether/internal/cli.version=$(VERSION)
BIN       := bin/tether
# The client-only build (-tags tetherclient): the client commands, none of the daemons.
CLIENT_BIN := bin/tether-client

# Extra flags for every `go test` (e.g. GOTESTFLAGS=-v or -run=TestFoo).
GOTESTFLAGS ?=
# Per-package `go test -timeout`: a hung package panics with every goroutine's stack
# after this long instead of running into CI's own limit (90 min) with no trace.
TESTTIMEOUT ?= 15m
E2ETIMEOUT  ?= 15m
# Per-target duration of `make fuzz`, which packages it searches for Fuzz* targets,
# and extra flags for its `go test -fuzz` runs (e.g. FUZZFLAGS=-parallel=2).
# FUZZMINIMIZETIME bounds the minimizing of each new input (go's default, 60s, can
# take a whole FUZZTIME from a target whose runs are slow, such as mirror's
# FuzzReceive, which builds a directory tree per input).
FUZZTIME  ?= 60s
FUZZPKGS  ?= ./...
FUZZMINIMIZETIME ?= 5s
FUZZFLAGS ?=
# `make bench` settings.
BENCHCOUNT ?= 5
BENCHPKGS  ?= ./...

# Images. The agent image is built FROM $(AGENT_BASE), made by `make docker-base`.
IMAGE_TAG   ?= dev
COORD_IMAGE ?= tether/coordinator:$(IMAGE_TAG)
AGENT_IMAGE ?= tether/agent:$(IMAGE_TAG)
AGENT_BASE  ?= tether/agent-base:local
DOCKER_CTX  := build/docker
# Set DEBOOTSTRAP=0 to force the host-assembled agent base even when debootstrap exists.
DEBOOTSTRAP ?= auto

.PHONY: help build build-client race-cc test test-unit test-e2e fuzz bench vet fmt-check generate \
        bench-ssh bench-forward bench-startup bench-reconnect monitoring-check docker docker-context docker-base docker-coordinator docker-agent opensandbox-fake nats-server compose-test ci-compose k8s-check k8s-smoke systemd-verify systemd-security dev clean

help: ## list the targets
	@echo "usage: make <target> [VAR=value]"
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-20s %s\n", $$1, $$2}'

# Extra flags for `make build`'s go build (`make dev` passes -v: each package
# is listed as it compiles, so a first build shows progress).
BUILDFLAGS ?=

build: ## build the static binary bin/tether (VERSION=... to override the version)
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/tether

build-client: ## build bin/tether-client: the client commands only (-tags tetherclient), for machines that only submit jobs; no coordinator, agent, dev, policy, config or nats
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -trimpath -tags tetherclient -ldflags "$(LDFLAGS)" -o $(CLIENT_BIN) ./cmd/tether

# -race needs cgo, which needs a C compiler: say which, instead of go's
# "-race requires cgo" after minutes of module downloads.
race-cc:
	@command -v "$${CC:-gcc}" >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 || { \
		echo "make: go test -race needs cgo and a C compiler, and there is none ($${CC:-gcc}): install gcc (Debian/Ubuntu: sudo apt-get install gcc; Fedora: dnf install gcc; macOS: xcode-select --install)" >&2; exit 1; }

test: ## the one test command (CI runs it): unit tests, then e2e, all under -race; fails if either half fails
	@# One after the other even under make -j: both load the 2 cores fully. The e2e half
	@# runs even when the unit half fails, so one flaky package never hides the e2e
	@# results; the exit status is non-zero if either half failed, naming which.
	@failed=""; \
	$(MAKE) --no-print-directory test-unit || failed="unit tests (make test-unit)"; \
	$(MAKE) --no-print-directory test-e2e || failed="$${failed:+$$failed and }e2e tests (make test-e2e)"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED: $$failed" >&2; exit 1; fi; \
	echo "make test: unit and e2e tests passed"

test-unit: race-cc ## unit and package tests under -race (each package times out after TESTTIMEOUT)
	$(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(GOTESTFLAGS) ./...

test-e2e: race-cc ## end-to-end tests (./e2e, build tag e2e; they build the binary themselves; E2ETIMEOUT per package)
	@if [ -d e2e ]; then \
		echo "$(GO) test -race -count=1 -timeout $(E2ETIMEOUT) -tags e2e $(GOTESTFLAGS) ./e2e/..."; \
		$(GO) test -race -count=1 -timeout $(E2ETIMEOUT) -tags e2e $(GOTESTFLAGS) ./e2e/...; \
	else \
		echo "WARNING: no ./e2e directory: end-to-end tests skipped" >&2; \
	fi

fuzz: ## run every Fuzz* target in FUZZPKGS for FUZZTIME each (default 60s); a table of executions at the end
	@# Every target runs, even after one fails; the table then says which, and
	@# the exit status is non-zero. Execs are the last "execs: N" go test prints.
	@# A bare "context deadline exceeded" at the end of -fuzztime, with no input
	@# written, is Go's own race (go.dev/issue/75804, fixed in Go 1.27; seen here
	@# on a loaded machine): reported as ok-deadline-race, not as a failure.
	@log=$$(mktemp -d); trap 'rm -rf "$$log"' EXIT; \
	rows=(); failed=0; found=0; mod=$$($(GO) list -m); \
	for pkg in $$($(GO) list $(FUZZPKGS)); do \
		list=$$($(GO) test -list '^Fuzz' "$$pkg") || { rows+=("$${pkg#$$mod/} - - LIST-FAILED"); failed=1; continue; }; \
		for f in $$(grep -E '^Fuzz' <<<"$$list" || true); do \
			found=1; out="$$log/$$found.$$f"; \
			echo "==> $$pkg $$f ($(FUZZTIME))"; \
			if $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $(FUZZFLAGS) "$$pkg" 2>&1 | tee "$$out"; then res=ok; \
			elif ! grep -q 'Failing input written' "$$out" && \
				[ "$$(grep -A1 -E '^--- FAIL: ' "$$out" | grep -vE '^--- FAIL: ' | tr -d ' \t')" = contextdeadlineexceeded ]; then \
				res=ok-deadline-race; \
			else res=FAIL; failed=1; fi; \
			execs=$$(grep -oE 'execs: [0-9]+' "$$out" | tail -n 1 | grep -oE '[0-9]+' || true); \
			rows+=("$${pkg#$$mod/} $$f $${execs:-0} $$res"); \
		done; \
	done; \
	if [ $$found = 0 ]; then echo "no Fuzz* targets found in $(FUZZPKGS)"; fi; \
	echo; printf '%-34s %-24s %12s  %s\n' PACKAGE TARGET EXECS RESULT; \
	for r in "$${rows[@]}"; do printf '%-34s %-24s %12s  %s\n' $$r; done; \
	exit $$failed

bench: ## benchmarks (count BENCHCOUNT) into bench.txt; summarised by benchstat if installed
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) $(BENCHPKGS) | tee bench.txt
	@if command -v benchstat >/dev/null 2>&1; then benchstat bench.txt; \
	else echo "(benchstat not installed: go install golang.org/x/perf/cmd/benchstat@latest)"; fi

# `make bench-ssh` settings (see README, Development).
SSHBENCH_TIMEOUT ?= 90m

bench-ssh: build ## OpenSSH via Tether vs a loopback sshd: interleaved rounds, median ratios (SSHBENCH_ROUNDS, SSHBENCH_BULK_MIB, SSHBENCH_FILES; BASE=old/tether adds it beside)
	@# Not in `make test`: it measures, and takes minutes. The tether under test is
	@# bin/tether (no -race); sshd is Debian's /usr/sbin/sshd, run as you on loopback.
	$(GO) test -count=1 -timeout $(SSHBENCH_TIMEOUT) -tags 'e2e sshbench' -run '^TestSSHBenchmark$$' -v \
		./e2e/ -args -tether-bin=$(CURDIR)/$(BIN) $(if $(BASE),-tether-base-bin=$(abspath $(BASE)))

bench-forward: build ## tether forward (direct, NATS) vs ssh -L aes128-gcm vs a 2-hop io.Copy relay (in one process, and as three): interleaved rounds, median ratios (FWDBENCH_ROUNDS, FWDBENCH_BULK_MIB, FWDBENCH_ECHOES; BASE=old/tether adds a fleet of it beside)
	$(GO) test -count=1 -timeout $(SSHBENCH_TIMEOUT) -tags 'e2e sshbench' -run '^TestForwardBenchmark$$' -v \
		./e2e/ -args -tether-bin=$(CURDIR)/$(BIN) $(if $(BASE),-tether-base-bin=$(abspath $(BASE)))

bench-startup: build build-client ## whole processes: tether and tether-client version vs /bin/true, their exec vs ssh through a ControlMaster (STARTBENCH_ROUNDS, STARTBENCH_RUNS; BASE=old/tether adds it beside)
	@# Not in `make test`: it measures. Needs Debian's openssh-client and openssh-server.
	$(GO) test -count=1 -timeout $(SSHBENCH_TIMEOUT) -tags 'e2e sshbench' -run '^TestStartupBenchmark$$' -v \
		./e2e/ -args -tether-bin=$(CURDIR)/$(BIN) -tether-client-bin=$(CURDIR)/$(CLIENT_BIN) $(if $(BASE),-tether-base-bin=$(abspath $(BASE)))

# `make bench-reconnect` settings (see README, Development).
RECONNECT_TIMEOUT ?= 30m

bench-reconnect: ## reconnect storm of RECONNECT_AGENTS (1000) simulated agents after a coordinator restart: paced vs unpaced, interleaved rounds, median ratios
	@# Not in `make test`: it measures, and takes minutes (RECONNECT_ROUNDS, RECONNECT_DOWNTIME, RECONNECT_FIXED_RATE).
	$(GO) test -count=1 -timeout $(RECONNECT_TIMEOUT) -tags reconnectbench -run '^TestReconnectStorm$$' -v ./coordinator/ | grep -v 'level='

# `make monitoring-check` settings: the promtool binary (Debian package prometheus;
# .ci/run unpacks it when it is missing).
PROMTOOL ?= promtool

monitoring-check: ## alert rules (promtool check rules + test rules) and the Grafana dashboard, checked against the metrics the binaries register
	@# The Go tests load deploy/grafana/tether.json (the Grafana dashboard shape, unique
	@# panel ids), list every metric the coordinator and the agent register (their
	@# real wiring), and fail on any dashboard, alert or rule-test series that names
	@# another; TETHER_REQUIRE_PROMTOOL makes the promtool parse of the dashboard's
	@# expressions a failure, not a skip, when promtool is missing.
	$(PROMTOOL) check rules deploy/prometheus/alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/alerts_test.yml
	$(GO) test -race -count=1 $(GOTESTFLAGS) ./internal/monitoring/
	PROMTOOL="$$(command -v $(PROMTOOL))" TETHER_REQUIRE_PROMTOOL=1 \
		$(GO) test -race -count=1 $(GOTESTFLAGS) -run '^TestMonitoring' ./cmd/tether/internal/cli/

vet: ## go vet ./...
	$(GO) vet ./...

fmt-check: ## fail if any Go file is not gofmt-formatted
	@out="$$(find . -name '*.go' -not -path './.git/*' -not -path './build/*' -not -path '*/testdata/*' -print0 | xargs -0 -r gofmt -l)"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

generate: ## regenerate generated code with pinned generators (protoc-gen-go v1.36.12 into bin/tools; needs protoc)
	@# protoc-gen-go is pinned here, installed into a local bin directory and put first on
	@# PATH for the go:generate lines (protocol/openshell/doc.go); protoc itself comes
	@# from the system (any version with proto3 optional, >= 3.15).
	GOBIN="$(CURDIR)/bin/tools" $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	PATH="$(CURDIR)/bin/tools:$$PATH" $(GO) generate ./...

# --- containers -------------------------------------------------------------
# No image is ever pulled: the coordinator image is FROM scratch, the agent
# image FROM a base assembled locally by `make docker-base`. Both copy the
# static binary built on the host, so `docker` depends on `build`.

docker: build docker-context docker-coordinator docker-agent ## build both images (tether/coordinator:dev, tether/agent:dev)

docker-context: build ## stage CA roots, passwd and data dirs for the images in build/docker
	rm -rf $(DOCKER_CTX)
	mkdir -p $(DOCKER_CTX)/rootfs/etc/ssl/certs $(DOCKER_CTX)/rootfs/tmp $(DOCKER_CTX)/data
	chmod 1777 $(DOCKER_CTX)/rootfs/tmp
	cp /etc/ssl/certs/ca-certificates.crt $(DOCKER_CTX)/rootfs/etc/ssl/certs/ca-certificates.crt
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/data:/sbin/nologin\n' \
		> $(DOCKER_CTX)/rootfs/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > $(DOCKER_CTX)/rootfs/etc/group
	touch $(DOCKER_CTX)/data/.keep

docker-base: ## build the agent base image tether/agent-base:local (debootstrap if present, else from host binaries)
	DEBOOTSTRAP=$(DEBOOTSTRAP) deploy/docker/agent-base.sh $(AGENT_BASE)

docker-coordinator: docker-context ## build the coordinator image only
	docker build -f Dockerfile.coordinator -t $(COORD_IMAGE) .

docker-agent: docker-context ## build the agent image only (builds the base first if it is missing)
	@docker image inspect $(AGENT_BASE) >/dev/null 2>&1 || $(MAKE) --no-print-directory docker-base
	docker build -f Dockerfile.agent --build-arg BASE=$(AGENT_BASE) -t $(AGENT_IMAGE) .

opensandbox-fake: ## build bin/opensandbox-fake, the OpenSandbox test double the compose test puts behind agent-1
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/opensandbox-fake ./deploy/compose/opensandbox-fake

compose-test: docker opensandbox-fake ## build the images, bring up deploy/compose (3 agents, a sandbox fake) and check enrollment, secrets, fan-out, node loss, the facade, policy and audit (deploy/compose/test.sh)
	TETHER=$(CURDIR)/$(BIN) TETHER_COORDINATOR_IMAGE=$(COORD_IMAGE) TETHER_AGENT_IMAGE=$(AGENT_IMAGE) deploy/compose/test.sh

ci-compose: ## CI's container step: images, make compose-test and the k8s/ha smoke test with docker present, else a loud skip; prints how long each took
	@# .ci/run calls this after `make test`. Without a docker daemon it skips
	@# (exit 0) with a banner; with one, any failure fails CI.
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
		echo "##########################################################################" >&2; \
		echo "## SKIPPED: make ci-compose: no docker daemon on this machine           ##" >&2; \
		echo "## the images, the compose fleet test and the k8s/ha smoke test did NOT ##" >&2; \
		echo "## run (make k8s-check, which needs no docker, did)                     ##" >&2; \
		echo "##########################################################################" >&2; \
		exit 0; \
	fi; \
	t0=$$(date +%s); \
	$(MAKE) --no-print-directory docker opensandbox-fake nats-server; \
	t1=$$(date +%s); \
	TETHER=$(CURDIR)/$(BIN) TETHER_COORDINATOR_IMAGE=$(COORD_IMAGE) TETHER_AGENT_IMAGE=$(AGENT_IMAGE) deploy/compose/test.sh; \
	t2=$$(date +%s); \
	TETHER=$(CURDIR)/$(BIN) NATS_SERVER=$(CURDIR)/bin/nats-server COORD_IMAGE=$(COORD_IMAGE) AGENT_IMAGE=$(AGENT_IMAGE) \
		AGENT_BASE=$(AGENT_BASE) deploy/k8s/ha-smoke.sh; \
	t3=$$(date +%s); \
	echo "ci-compose: images built in $$((t1 - t0))s, compose fleet test ran in $$((t2 - t1))s, the k8s/ha smoke test in $$((t3 - t2))s, $$((t3 - t0))s in all"

nats-server: ## build bin/nats-server (the nats-server release of go.mod) for make k8s-smoke
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/nats-server github.com/nats-io/nats-server/v2

k8s-smoke: docker nats-server ## run deploy/k8s/ha's pods as containers: NATS cluster, coordinators, agents, a coordinator stopped (deploy/k8s/ha-smoke.sh; needs docker)
	TETHER=$(CURDIR)/$(BIN) NATS_SERVER=$(CURDIR)/bin/nats-server COORD_IMAGE=$(COORD_IMAGE) AGENT_IMAGE=$(AGENT_IMAGE) \
		AGENT_BASE=$(AGENT_BASE) deploy/k8s/ha-smoke.sh

# The manifest check is its own module (deploy/k8s/check/go.mod), so that the
# Kubernetes API types and nats-server's config parser stay out of go.mod.
k8s-check: build ## validate deploy/k8s offline: strict decode into the k8s.io/api types, references, NATS credentials and NetworkPolicies
	@layout=$$(mktemp -d); trap 'rm -rf "$$layout"' EXIT; \
	./$(BIN) nats server-config --data-dir "$$layout/data" > "$$layout/tether-layout.conf" 2>/dev/null; \
	cd deploy/k8s/check && TETHER_K8S_DIR=$(CURDIR)/deploy/k8s TETHER_NATS_LAYOUT=$$layout/tether-layout.conf \
		$(GO) test -count=1 $(GOTESTFLAGS) ./...

# --- systemd units --------------------------------------------------------------

systemd-verify: build ## systemd-analyze verify systemd/*.service, with ExecStart pointed at bin/tether; any message fails (skipped without systemd-analyze unless REQUIRE_SYSTEMD_ANALYZE=1)
	systemd/verify.sh $(BIN)

systemd-security: build ## systemd-verify, then the units' `systemd-analyze security --offline` exposure scores
	systemd/verify.sh $(BIN) --security

# --- local runs ---------------------------------------------------------------

dev: ## build (listing each package as it compiles), then run `tether dev` (coordinator + embedded NATS + one agent); DEV_FLAGS=... adds flags
	@echo ">> building $(BIN): go lists each package as it compiles it (the first build downloads the modules and takes minutes)"
	@$(MAKE) --no-print-directory build BUILDFLAGS="-v $(BUILDFLAGS)"
	@echo ">> built $(BIN); starting tether dev (Ctrl-C stops it)"
	@# env -u: the jobs dev's agent runs must not inherit make's variables (a job's make would take itself for a sub-make)
	env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u MAKEOVERRIDES -u MAKE_TERMOUT -u MAKE_TERMERR ./$(BIN) dev $(DEV_FLAGS)

clean: ## remove build outputs
	rm -rf bin build bench.txt
