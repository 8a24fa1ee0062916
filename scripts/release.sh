#!/usr/bin/env bash
# Reproducible, CGO-free release build of chunlian.
#
#   scripts/release.sh                 # dist/chunlian_<version>_<os>_<arch>.tar.gz + dist/SHA256SUMS
#   TARGETS="linux/amd64" scripts/release.sh
#   scripts/release.sh --verify        # also build linux/amd64 twice from `git archive HEAD` in two
#                                      # directories, once with an empty Go build cache, and compare
#
# Inputs (all optional): VERSION (default: git describe), SOURCE_DATE_EPOCH
# (default: the commit's time; it sets the build date and every timestamp in
# the tarballs), OUT (default dist), TARGETS (default: linux/amd64
# linux/arm64 darwin/amd64 darwin/arm64; windows does not build: the CUDA
# loader needs dlopen).
#
# Reproducible means: the same commit, the same Go toolchain (go.mod's
# `go` line) and the same inputs give byte-identical binaries and tarballs
# on any machine and in any directory: -trimpath drops paths, -buildid= and
# -buildvcs=false drop the per-build ids (the commit goes in through -X),
# GOAMD64/GOARM64 are pinned, CGO is off (no C toolchain involved), and tar
# gets fixed names, owners, order and mtimes, gzip no timestamp.
set -euo pipefail
cd "$(dirname "$0")/.."

verify=0
[ "${1:-}" = "--verify" ] && verify=1

commit=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  commit="$commit+dirty"
  echo "release: warning: the tree has uncommitted changes (revision $commit)" >&2
fi
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export SOURCE_DATE_EPOCH
date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r "$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
OUT=${OUT:-dist}
TARGETS=${TARGETS:-"linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"}

ldflags="-s -w -buildid= -X chunlian/buildinfo.version=$VERSION -X chunlian/buildinfo.commit=$commit -X chunlian/buildinfo.date=$date"

# build_one SRC_DIR GOOS GOARCH OUTFILE
build_one() {
  (cd "$1" && CGO_ENABLED=0 GOOS=$2 GOARCH=$3 GOAMD64=v1 GOARM64=v8.0 GOFLAGS= \
    go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$4" ./cmd/chunlian)
}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
sums=()
for t in $TARGETS; do
  os=${t%/*} arch=${t#*/}
  name="chunlian_${VERSION}_${os}_${arch}"
  stage="$OUT/$name"
  rm -rf "$stage" && mkdir -p "$stage"
  echo "release: $t"
  build_one . "$os" "$arch" "$stage/chunlian"
  [ -x "$stage/chunlian" ] || { echo "release: $t: no binary" >&2; exit 1; }
  cp LICENSE README.md "$stage/"
  [ -f docs/DEPLOY.md ] && cp docs/DEPLOY.md "$stage/"
  [ -d deploy/systemd ] && cp deploy/systemd/chunlian.service "$stage/"
  touch -d "@$SOURCE_DATE_EPOCH" "$stage" "$stage"/*
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$OUT" -cf - "$name" | gzip -9 -n > "$OUT/$name.tar.gz"
  rm -rf "$stage"
  sums+=("$name.tar.gz")
done
(cd "$OUT" && sha256sum "${sums[@]}" > SHA256SUMS && cat SHA256SUMS)

if [ $verify = 1 ]; then
  # Build linux/amd64 twice from pristine exports of HEAD in two different
  # directories, the second with an empty build cache (every package,
  # the standard library included, compiled again), and compare the bytes.
  tmp=$(mktemp -d)
  trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
  for d in a b; do
    mkdir -p "$tmp/$d" && git archive HEAD | tar -x -C "$tmp/$d"
  done
  build_one "$tmp/a" linux amd64 "$tmp/chunlian-a"
  echo "release: verify: rebuilding linux/amd64 elsewhere with an empty GOCACHE (minutes)"
  GOCACHE="$tmp/cache" build_one "$tmp/b" linux amd64 "$tmp/chunlian-b"
  a=$(sha256sum < "$tmp/chunlian-a" | cut -d' ' -f1) b=$(sha256sum < "$tmp/chunlian-b" | cut -d' ' -f1)
  echo "release: verify: $a vs $b"
  if [ "$a" != "$b" ]; then
    echo "release: verify: NOT reproducible" >&2
    exit 1
  fi
  echo "release: verify: byte-identical"
fi
