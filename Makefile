# sendonce: make demo runs the pipeline end to end; make test runs the suite.
GO      ?= go
BIN     := bin
CMDS    := relay sender smsstub demo

.PHONY: build demo test vet clean

build:
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

demo: build
	./$(BIN)/demo

test:
	$(GO) test -race -count=1 -timeout 30m ./...

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l .; echo "gofmt: files above need formatting"; exit 1)

clean:
	rm -rf $(BIN) bench.json
