# Multi-stage build: static binaries on a distroless, non-root base.
# The Go image is the exact patch release go.mod's toolchain line pins
# (pinned_test.go keeps the two equal; scripts/govulncheck.sh checks that
# release's standard library). Pin each base by digest where you build: the
# tags below are exact, but a tag can be pushed again.
FROM golang:1.26.11-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/relay ./cmd/sender ./cmd/receiver ./cmd/smsstub

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/relay"]
