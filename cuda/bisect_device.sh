#!/bin/bash
# Builds cuda.test for each commit of a range into .carry/cuda/bisect/ so
# that one device call can find the first commit where a GPU benchmark or
# test breaks (`bash cuda/h200.sh bisect`, carry [".carry/cuda"]):
#   bash cuda/bisect_device.sh 0f45ec1 61effcd
# Each binary is built from `git archive <commit>` with the embedded model
# stubbed (as build_device.sh does), with -trimpath so that a commit that
# changes nothing cuda.test is built from gives the same bytes: such a
# binary is not kept (ORDER.txt names the commit it duplicates), which keeps
# the carried folder small. Kept binaries are gzipped (~2.2 MB each).
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
	(cd "$T" && CGO_ENABLED=0 go test -c -trimpath -ldflags="-s -w" -o "$OLDPWD/$D/$s.test" ./cuda/)
	rm -rf "$T"
	if [ -n "${prev:-}" ] && cmp -s "$D/$s.test" "$D/$prev.test"; then
		rm "$D/$s.test"
		echo "# $s same binary as $prev: $(git log -1 --format=%s "$c" | cut -c1-60)" >> "$D/ORDER.txt"
		continue
	fi
	[ -n "${prev:-}" ] && gzip -f "$D/$prev.test"
	prev=$s
	echo "$s $(git log -1 --format=%s "$c" | cut -c1-80)" >> "$D/ORDER.txt"
done
gzip -f "$D/$prev.test"
cat "$D/ORDER.txt"
