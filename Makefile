# sendonce: make demo runs the pipeline end to end; make test runs the suite.
GO      ?= go
BIN     := bin
CMDS    := relay sender receiver smsstub demo
TOOLS   := soak bench

.PHONY: build crash-build demo soak drill bench bench-retention console-bench bench-smoke test test-cluster docs vet clean fuzz

build:
	$(GO) build -buildvcs=auto -o $(BIN)/ $(addprefix ./cmd/,$(CMDS)) $(addprefix ./tools/,$(TOOLS))
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

demo: build
	./$(BIN)/demo

# The relay, sender and stub with their crash points compiled in, for the
# soak only: a default build ignores SENDONCE_CRASHPOINTS. The receiver
# (SOAK_ARGS="-provider lookup") goes beside them.
CRASH_BIN := $(BIN)/crash
crash-build:
	$(GO) build -buildvcs=auto -tags sendonce_crashpoints -o $(CRASH_BIN)/ ./cmd/relay ./cmd/sender ./cmd/smsstub ./cmd/receiver

# soak: rows through 2 relays and 3 senders under random faults; SOAK_ROWS
# (default 100000) or SOAK_ARGS="-rows 5000 -seed 42" to change it;
# SOAK_ARGS="-cluster" runs NATS as a 3-node cluster with leader kills;
# SOAK_ARGS="-provider lookup" a provider without idempotency, settled by
# lookups and receipts, on a Postgres primary and standby that fail over;
# SOAK_ARGS="-provider twilio" the same at the stub's Twilio facade, whose
# lookups page through each number's messages.
# SOAK_ARGS="-provider failover" two providers (SMS_PROVIDERS=generic,twilio),
# the faults on the first: no message may go out through both.
# SOAK_ARGS="-provider pair" the same list without lookups, the first honouring
# keys, with rolling restarts of the senders: no row may end unknown.
soak: build crash-build
	./$(BIN)/soak -bin $(CRASH_BIN) $(SOAK_ARGS)

# drill: scripted failures with the binaries' default settings, timed:
# NATS restarted on an empty store, then a Postgres failover (a streaming
# standby promoted after the primary crashed), at an idempotent provider and
# at one without idempotency that the senders look up (no second delivery
# allowed). DRILL_ROWS (default 20000).
# Its database is its own (sendonce_soak_drill), so that a soak running at
# the same time on the same server is not dropped under it.
DRILL_ROWS ?= 20000
DRILL_DB   ?= postgres://postgres@127.0.0.1:5432/sendonce_soak_drill?sslmode=disable
drill: build crash-build
	./$(BIN)/soak -rows $(DRILL_ROWS) -drill store-loss -database-url '$(DRILL_DB)' $(DRILL_ARGS)
	./$(BIN)/soak -rows $(DRILL_ROWS) -drill pg-failover $(DRILL_ARGS)
	./$(BIN)/soak -rows $(DRILL_ROWS) -drill pg-failover -provider lookup $(DRILL_ARGS)

bench: build
	./$(BIN)/bench

# bench-retention: retention on a large table, DELETE-based purge against
# dropping a day's partitions, on SENDONCE_RETENTION_BENCH_ROWS rows (default
# 10,000,000; loading them takes minutes). Not part of make test.
bench-retention:
	$(GO) test -run '^$$' -bench BenchmarkRetentionDeleteVsPartitionDrop -benchtime 1x -timeout 60m -v ./internal/relay/

# console-bench: the operator console's pages on a 1,000,000-row outbox
# (SENDONCE_CONSOLE_ROWS to change): time to first byte and bytes per page.
console-bench:
	$(GO) test -run '^$$' -bench BenchmarkPages -benchtime 20x -timeout 30m ./internal/console/

# test also runs every Go benchmark once on small data (bench-smoke), so
# that a benchmark broken by a schema change fails here, not the day
# someone needs its figures.
test: bench-smoke
	$(GO) test -race -count=1 -timeout 30m ./...

BENCH_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^func Benchmark' .)))
bench-smoke:
	SENDONCE_RETENTION_BENCH_ROWS=2000 SENDONCE_CONSOLE_ROWS=10000 \
		$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 10m $(BENCH_PKGS)

# docs: regenerate the settings tables of docs/configuration.md from the
# programs' flag definitions (go test fails while they differ).
docs:
	SENDONCE_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestSettingsDoc$$' ./cmd/...

# test-cluster: every test on a 3-node JetStream cluster of nats-server
# processes (leader kills, a rolling restart, a node's store lost); make
# test runs a representative part of them.
test-cluster:
	CLUSTER_TESTS=all $(GO) test -race -count=1 -timeout 30m -run 'Cluster|StoreLoss|LeaderChange|ScalesUp' -v ./e2e/ ./internal/streams/

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l .; echo "gofmt: files above need formatting"; exit 1)

# chart-check: render the Helm chart (deploy/helm/sendonce) with Helm's SDK
# for each value set, lint it, and validate every object it renders against
# the Kubernetes, KEDA and prometheus-operator schemas and the programs'
# settings. A Go module of its own (deploy/helm/check), run by .ci/run.
.PHONY: chart-check
chart-check:
	bash deploy/helm/check.sh

clean:
	rm -rf $(BIN) bench.json

# Each fuzz target for FUZZTIME (60s; CI gives a count of runs, 30000x: a
# duration can end in a spurious "context deadline exceeded" under load, a race
# in Go 1.26's fuzzing coordinator fixed in Go 1.27).
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	FuzzParseRetryAfter:./internal/provider \
	FuzzClassifyBody:./internal/provider \
	FuzzScrub:./internal/provider \
	FuzzDecode:./internal/wire \
	FuzzParse:./internal/envflag

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		name=$${t%%:*}; pkg=$${t#*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done
