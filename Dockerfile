# syntax=docker/dockerfile:1
#
# rls in a container: a static binary on distroless, run as nonroot.
#
#   docker build -t rls --build-arg VERSION=$(git describe --tags --always --dirty) .
#   docker run --rm -p 8080:8080 -p 8081:8081 rls
#
# The image serves /etc/rls/limits.yaml (a copy of config/limits.yaml) on the embedded
# memory store; mount your own directory over /etc/rls, or pass other flags after the image
# name (they replace CMD): docker run rls serve --config /etc/rls --store redis ...
# docker-compose.yaml in this directory runs it with Redis behind Envoy.

# The Go release matches go.mod's go directive (e2e/docker_test.go checks it). The
# builder runs on the build machine's platform and cross-compiles for the target one,
# so a multi-platform build (docker buildx build --platform linux/amd64,linux/arm64)
# needs no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG TARGETOS TARGETARCH
# The version `rls version` prints; the Makefile passes git describe the same way.
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/rls ./cmd/rls
# /bin/ratelimit, the command Envoy Gateway runs: rls started under the name ratelimit
# reads envoyproxy/ratelimit's environment (docs/migrating-from-envoy-ratelimit.md). A
# symlink, made here because the final image has no shell; copying the directory keeps it.
RUN mkdir -p /out/bin && ln -s /rls /out/bin/ratelimit

# static-debian12: CA certificates (rediss://), tzdata and /etc/passwd, no shell, no
# package manager. The :nonroot tag's user is 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rls /rls
COPY --from=build /out/bin/ /bin/
COPY config/limits.yaml /etc/rls/limits.yaml
USER nonroot:nonroot
# 8080: HTTP (/healthz, /readyz, /healthcheck, /metrics, /json, /auth/{domain}); 8081: gRPC
# (RateLimitService, Authorization, health, reflection). As /bin/ratelimit, also 6070
# (DEBUG_PORT) and PROMETHEUS_ADDR when USE_PROMETHEUS=true.
EXPOSE 8080 8081
# The image has no curl: rls asks its own /readyz (200 once the config is loaded and the
# store answers). With another --http-addr, give the URL:
#   HEALTHCHECK CMD ["/rls", "healthcheck", "http://127.0.0.1:9090/readyz"]
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/rls", "healthcheck"]
ENTRYPOINT ["/rls"]
CMD ["serve", "--config", "/etc/rls/limits.yaml"]
