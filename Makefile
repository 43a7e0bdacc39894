# Gantry: `make dev` runs the whole system on embedded defaults; `make test` runs every
# test against real PostgreSQL, NATS and Redis (see shared/testenv for how they are found).
GO       ?= go
SQLC     ?= $(GO) run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1
PKGS     := ./shared/... ./proto/... ./controlplane/... ./nodeagent/... ./loggateway/... ./cli/... ./deploy/...
# go-nvml (cgo, needed even for its mocks) includes nvml.h, whose deprecated functions
# make gcc print pages of warnings on every rebuild.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# Three test binaries at once on two cores: most packages wait on PostgreSQL, NATS or a
# child process rather than compute, and -p 2 (GOMAXPROCS) left the budget unused.
TESTFLAGS ?= -race -count=1 -timeout 12m -p 3

.PHONY: dev test bench generate check-generate lint build package

# Built first and then run, so Ctrl-C reaches the control plane itself (which drains and
# exits 0) rather than `go run`.
dev: build
	./bin/gantry-controlplane dev

# The fuzz targets run briefly, by execution count (about what 5-10 s gave on this
# machine): a duration -fuzztime races Go's fuzz coordinator at its deadline and fails
# a loaded run with a bare "context deadline exceeded" and no failing input
# (golang/go#75804, fixed in Go 1.27; seen here on go1.26.8 in FuzzCursorTamper).
test:
	$(GO) test $(TESTFLAGS) $(PKGS)
	$(GO) test -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime 60000x ./shared/fabricnet
	$(GO) test -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime 150000x ./shared/termproto
	$(GO) test -run '^$$' -fuzz '^FuzzWriteData$$' -fuzztime 120000x ./shared/termproto
	$(GO) test -run '^$$' -fuzz '^FuzzParseClientFrame$$' -fuzztime 2500x ./controlplane/internal/terminal
	$(GO) test -run '^$$' -fuzz '^FuzzPushDecode$$' -fuzztime 30000x ./loggateway/gateway
	$(GO) test -run '^$$' -fuzz '^FuzzCursorDecode$$' -fuzztime 120000x ./controlplane/internal/pagination
	$(GO) test -run '^$$' -fuzz '^FuzzCursorTamper$$' -fuzztime 50000x ./controlplane/internal/pagination
	$(GO) test -run '^$$' -fuzz '^FuzzVerifySignature$$' -fuzztime 7000x ./controlplane/internal/payments
	$(GO) test -run '^$$' -fuzz '^FuzzClean$$' -fuzztime 12000x ./controlplane/internal/storage/objpath

# Benchmarks print their ratio against a baseline measured in the same run.
bench:
	$(GO) run ./controlplane/cmd/gantry-bench
	@echo; echo "MAAS lifecycle (100 concurrent onboardings to succeeded against the simulator vs bare gomaasclient sequences, same run):"
	@$(GO) run ./controlplane/cmd/gantry-bench -only maas
	$(GO) run ./loggateway/cmd/gantry-loggateway-bench
	@echo; echo "browser terminal (keystroke echo through WebSocket -> control plane -> tunnel -> agent PTY; added = vs pty-direct in the same run):"
	@{ $(GO) test -run '^$$' -bench 'BenchmarkTerminalEcho' -benchtime 2000x ./controlplane/internal/terminal; \
	   $(GO) test -run '^$$' -bench 'BenchmarkTerminalThroughput' -benchtime 3x ./controlplane/internal/terminal; } | ./scripts/terminal-bench-report.awk
	@echo; echo "gantry CLI: 'gantry alloc list' wall time from process start (goal 100 ms; p50/p99 in ms) vs the binary alone (--version) and the in-process generated client, same run:"
	@$(GO) test -run '^$$' -bench 'BenchmarkCLIAllocList' -benchtime 30x ./controlplane/e2e | grep '^Benchmark'
	@echo; echo "ssh through the node tunnel (scp 1 GiB and PTY keystroke echo vs a local sshd on loopback, same run):"
	@GANTRY_SSH_BENCH=1 $(GO) test -count=1 -timeout 30m -run '^TestSSHBench$$' -v ./controlplane/e2e | grep '^ssh:'
	@echo; echo "storage attachment (1 GiB read inside an allocation through a ro attachment vs API GET, same run):"
	@$(GO) test -run '^$$' -bench 'BenchmarkStorageAttachmentRead' -benchtime 1x ./controlplane/e2e | grep '^storage attachment'

build:
	$(GO) build -o bin/ ./controlplane/cmd/... ./nodeagent/cmd/... ./loggateway/cmd/... ./cli/cmd/...

# The node agent's Debian package and its .sha256 (deploy/packaging), for the control
# plane to serve to machines MAAS deploys (GANTRY_NODEAGENT_PACKAGE).
VERSION ?= 0.0.0-dev
package:
	$(GO) run ./deploy/cmd/gantry-package -version $(VERSION) -out bin

generate:
	$(GO) generate ./proto/...
	./proto/fabric/generate.sh
	cd controlplane && GOWORK=off GOFLAGS= $(SQLC) generate

# Fails when committed generated code differs from what `make generate` produces.
check-generate: generate
	git diff --exit-code -- proto controlplane

lint:
	@out=$$(gofmt -l shared proto controlplane nodeagent loggateway cli); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
