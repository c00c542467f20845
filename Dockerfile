# Multi-stage build: static binaries on a distroless, non-root base.
# The Go image is the exact patch release go.mod's toolchain line pins
# (pinned_test.go keeps the two equal; scripts/govulncheck.sh checks that
# release's standard library). Pin each base by digest where you build: the
# tags below are exact, but a tag can be pushed again.
#
# Three images: the default (last) stage, sendonce, holds the relay, the
# sender and the receiver, and is the one to deploy; the smsstub stage
# holds only the provider stub, a test double whose /admin is
# unauthenticated, and is never part of the production image
# (docker build --target smsstub); the dblogins stage runs
# deploy/postgres/logins.sh once (docker build --target dblogins).
FROM golang:1.26.11-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/relay ./cmd/sender ./cmd/receiver
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /stub/ ./cmd/smsstub

# The provider stub, for a laptop or a test environment only.
FROM gcr.io/distroless/static-debian12:nonroot AS smsstub
COPY --from=build /stub/smsstub /usr/local/bin/smsstub
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/smsstub"]

# docker-compose's one-shot db-logins: psql for deploy/postgres/logins.sh,
# and the relay binary, whose "relay scram-verifier" turns each login's
# password into a SCRAM-SHA-256 verifier before anything is sent to the
# server. Not a runtime image.
FROM postgres:15 AS dblogins
COPY --from=build /out/relay /usr/local/bin/relay

# The production image: relay, sender, receiver.
FROM gcr.io/distroless/static-debian12:nonroot AS sendonce
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/relay"]
