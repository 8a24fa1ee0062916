#!/bin/bash
# Builds cuda.test for each commit of a range into .carry/cuda/bisect/ so
# that one device call can find the first commit where a GPU benchmark or
# test breaks (`bash cuda/h200.sh bisect`, carry [".carry/cuda"]):
#   bash cuda/bisect_device.sh 0f45ec1 61effcd
# Each binary is built from `git archive <commit>` with the embedded model
# stubbed (as build_device.sh does) and gzipped (~2.2 MB each).
set -euo pipefail
cd "$(dirname "$0")/.."
GOOD=$1 BAD=$2
D=.carry/cuda/bisect
rm -rf "$D"; mkdir -p "$D"
for c in $(git rev-list --reverse "$GOOD^..$BAD"); do
	T=$(mktemp -d)
	git archive "$c" | tar -xf - -C "$T"
	: > "$T/weights/chunlian-base/model.safetensors"
	s=$(git rev-parse --short=7 "$c")
	(cd "$T" && CGO_ENABLED=0 go test -c -ldflags="-s -w" -o "$OLDPWD/$D/$s.test" ./cuda/)
	rm -rf "$T"
	gzip -f "$D/$s.test"
	echo "$s $(git log -1 --format=%s "$c" | cut -c1-80)" >> "$D/ORDER.txt"
done
cat "$D/ORDER.txt"
