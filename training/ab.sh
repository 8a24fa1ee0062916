#!/bin/bash
# Two training runs side by side in one device call: same data, same GPU,
# same start and the same time budget, so their figures compare within one
# run (the device's speed varied 53-81 ms/step between calls, REPORT.md).
#
#   # device tool: run(command=..., carry=[".carry/chunlian"], timeout_s=600)
#   bash training/ab.sh "<train.py flags of run a>" "<train.py flags of run b>"
#
# Each run is training/pipeline.py with --smoke-train-only, its own work dir
# and --deadline 540 (both run at once, so each gets about half the GPU).
# $OUT gets log-a, log-b and ab.tar.part-*: join and unpack with
#   cat ab.tar.part-* | tar xf -     # → ab-a/, ab-b/ as pipeline.py ships them
# (the device tool returns at most 8 files; two shipped runs are 10).
# Run 10/10b lost run b's results.tar.gz this way before the order below.
set -u
O=${OUT:?OUT must name the folder that comes back}
run() {
	local tag=$1 flags=$2
	# shellcheck disable=SC2086  # flags are word-split on purpose
	PYTHONUNBUFFERED=1 timeout 565 python3 training/pipeline.py --out /tmp/ab-$tag --work /tmp/work-$tag \
		--deadline 540 --minutes 8 --post-reserve 45 --smoke-train-only -- $flags > /tmp/ab-$tag/log 2>&1
	echo "run $tag rc=$?" >> /tmp/ab-$tag/log
}
rm -rf /tmp/ab-a /tmp/ab-b /tmp/work-a /tmp/work-b
mkdir -p /tmp/ab-a /tmp/ab-b
run a "$1" &
run b "$2" &
wait
cp /tmp/ab-a/log "$O/log-a"
cp /tmp/ab-b/log "$O/log-b"
# Small files first, run a's model before run b's: the device tool brings
# back about 64 MiB in all, and two models (33 + 39 MB in run 10/10b) are
# more, so the tail of run b's model is what gets left out.
(cd /tmp && tar cf - ab-a/log ab-b/log ab-a/results.tar.gz ab-b/results.tar.gz ab-a/model.safetensors.part-* \
	ab-b/model.safetensors.part-*) | split -b 15M -d - "$O/ab.tar.part-"
ls -la "$O"
tail -n 3 "$O/log-a" "$O/log-b"
