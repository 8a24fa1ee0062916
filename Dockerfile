# chunlian, CPU image: multi-stage, non-root, HEALTHCHECK on /health.
#
#   docker build -t chunlian:cpu --build-arg VERSION=$(git describe --tags --always) \
#                --build-arg COMMIT=$(git rev-parse HEAD) .
#   docker run --rm -p 8000:8000 chunlian:cpu
#
# The binary is static (CGO_ENABLED=0) with the model embedded; the runtime
# stage adds OpenBLAS (optional at run time, loaded with dlopen: faster
# large GEMMs, docs/BENCHMARKS.md) and curl for the health check.
# Orchestrators: liveness = GET /health, readiness = GET /ready (503 while
# the model loads and while draining). GPU image: deploy/Dockerfile.cuda.

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -buildid= -X chunlian/buildinfo.version=${VERSION} -X chunlian/buildinfo.commit=${COMMIT} -X chunlian/buildinfo.date=${BUILD_DATE}" \
      -o /out/chunlian ./cmd/chunlian \
 && /out/chunlian version --short

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libopenblas0-pthread curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin chunlian
COPY --from=build /out/chunlian /usr/local/bin/chunlian
COPY LICENSE /usr/share/doc/chunlian/LICENSE
USER 10001:10001
ENV CHUNLIAN_ADDR=0.0.0.0:8000 \
    CHUNLIAN_LOG_FORMAT=json \
    CHUNLIAN_DRAIN_DELAY=5s \
    CHUNLIAN_DRAIN_TIMEOUT=30s
EXPOSE 8000
# /health is liveness (the process serves HTTP); the model loads in ~1 s.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8000/health || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/chunlian"]
CMD ["serve"]
