#!/bin/bash
# Builds the GPU machine's binaries into .carry/cuda/ (CGO_ENABLED=0,
# stripped) from the committed tree (git archive HEAD: other helpers'
# half-written files in the shared working tree do not leak in, and
# .carry/cuda/BUILD.txt names the commit), whose embedded model file is a stub:
# the device tool moves at most 64 MiB (tree + carried files) and the
# tracked weights already travel, so the binaries load them with
# --model weights/chunlian-base instead of embedding a second copy.
set -euo pipefail
cd "$(dirname "$0")/.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
git archive HEAD | tar -xf - -C "$T"
: > "$T/weights/chunlian-base/model.safetensors"
mkdir -p .carry/cuda
# The default build, as users run it. GOEXPERIMENT=simd (AVX2/AVX-512
# host kernels) can be passed in the environment, but on the H200 host it
# measured slower (docs/BENCHMARKS.md, H200 section).
export GOEXPERIMENT=${GOEXPERIMENT:-}
(cd "$T" && CGO_ENABLED=0 go test -c -ldflags="-s -w" -o "$OLDPWD/.carry/cuda/cuda.test" ./cuda/ &&
	CGO_ENABLED=0 go build -ldflags="-s -w" -o "$OLDPWD/.carry/cuda/chunlian" ./cmd/chunlian)
{ git rev-parse HEAD; git log -1 --format=%s; go env GOEXPERIMENT; date -u; } > .carry/cuda/BUILD.txt
# BASE=<commit>: also build that commit's chunlian as chunlian-base (the
# comparison build of `h200.sh s3`), and gzip the binaries so that both
# builds, cuda.test and the tree fit the device tool's 64 MiB.
if [ -n "${BASE:-}" ]; then
	B=$(mktemp -d)
	git archive "$BASE" | tar -xf - -C "$B"
	: > "$B/weights/chunlian-base/model.safetensors"
	(cd "$B" && CGO_ENABLED=0 go build -ldflags="-s -w" -o "$OLDPWD/.carry/cuda/chunlian-base" ./cmd/chunlian)
	rm -rf "$B"
	{ git rev-parse "$BASE"; git log -1 --format=%s "$BASE"; } > .carry/cuda/BASE.txt
	gzip -f .carry/cuda/chunlian .carry/cuda/chunlian-base .carry/cuda/cuda.test
fi
ls -la .carry/cuda
