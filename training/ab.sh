#!/bin/bash
# One to six training runs side by side in one device call: same data, same
# GPU, same start and the same time budget, so their figures compare within
# one run (the device's speed varied 53-81 ms/step between calls, REPORT.md).
# Then, with two or more, their average (training/soup.py: a soup of the
# runs, recalibrated and evaluated) as one more candidate; and a ranking of
# all of them. One run gets the whole GPU (~1.7x the steps of a two-way share).
#
#   # device tool: run(command=..., carry=[".carry/chunlian"], timeout_s=600)
#   bash training/ab.sh "<train.py flags of run a>" ["<run b>" ...]
#
# Each run is training/pipeline.py with --smoke-train-only, its own work dir
# (/tmp/work-a, -b, ...) and --deadline $AB_DEADLINE (default 480 s: the runs
# share the GPU, and the soup needs ~60 s after them). AB_SOUP=0 skips the soup,
# AB_SMOKE=0 the smoke pass (for code that has already run on the device).
# AB_POST_RESERVE (default 45 s) is what each pipeline keeps after training for
# export, calibration, eval, fixture and the GPU bench; with three runs sharing
# the GPU those took longer and the bench was cut (run 22, REPORT.md): use 75.
# $OUT gets summary.txt (the ranking and each log's end) and ab.tar.part-*:
# join and unpack with
#   cat ab.tar.part-* | tar xf -
# → ab-<run>/ as pipeline.py ships them (log, results.tar.gz), soup-small/
# (the soup's log and small files), and best/: the whole directory of the best-ranked
# candidate, model.safetensors included. Only one model comes back: the
# device tool returns about 64 MiB, and two 33 MB models are more.
set -u
O=${OUT:?OUT must name the folder that comes back}
deadline=${AB_DEADLINE:-480}
post=${AB_POST_RESERVE:-45}
tags=(a b c d e f)
smoke=--smoke-train-only
[ "${AB_SMOKE:-1}" = 0 ] && smoke=--skip-smoke  # the trainer's smoke pass, ~60 s
[ $# -ge 1 ] && [ $# -le ${#tags[@]} ] || { echo "usage: ab.sh FLAGS_A [FLAGS_B ...] (1 to ${#tags[@]} runs)" >&2; exit 2; }
run() {
	local tag=$1 flags=$2
	# shellcheck disable=SC2086  # flags are word-split on purpose
	PYTHONUNBUFFERED=1 timeout $((deadline + 25)) python3 training/pipeline.py --out /tmp/ab-$tag --work /tmp/work-$tag \
		--deadline "$deadline" --minutes 8 --post-reserve "$post" $smoke -- $flags > /tmp/ab-$tag/log 2>&1
	echo "run $tag rc=$?" >> /tmp/ab-$tag/log
}
rm -rf /tmp/ab-* /tmp/work-* /tmp/soup /tmp/soup-log /tmp/soup-small /tmp/best /tmp/ranking
runs=() models=()
for i in $(seq 0 $(($# - 1))); do
	t=${tags[$i]}
	mkdir -p /tmp/ab-$t
	runs+=("$t") models+=("/tmp/work-$t/chunlian-base")
done
i=0
for flags in "$@"; do
	run "${runs[$i]}" "$flags" &
	i=$((i + 1))
done
wait

# The soup of the runs that exported a model.
have=()
for m in "${models[@]}"; do [ -f "$m/model.safetensors" ] && have+=("$m"); done
cands=("${have[@]}")
if [ ${#have[@]} -ge 2 ] && [ "${AB_SOUP:-1}" != 0 ]; then
	PYTHONUNBUFFERED=1 timeout 90 python3 training/soup.py make --data .carry/chunlian --out /tmp/soup "${have[@]}" \
		> /tmp/soup-log 2>&1
	echo "soup rc=$?" >> /tmp/soup-log
	cands+=(/tmp/soup)
fi
S=$O/summary.txt
python3 training/soup.py rank "${cands[@]}" > /tmp/ranking 2> "$S"
best=$(head -n 1 /tmp/ranking)
rm -rf /tmp/best /tmp/soup-small
[ -n "$best" ] && cp -r "$best" /tmp/best && echo "best: $best" >> "$S"
for l in /tmp/ab-*/log /tmp/soup-log; do [ -f "$l" ] && { echo "== $l"; tail -n 4 "$l"; } >> "$S"; done
cat "$S"
mkdir -p /tmp/soup-small
[ -f /tmp/soup-log ] && cp /tmp/soup-log /tmp/soup-small/log
[ -d /tmp/soup ] && find /tmp/soup -maxdepth 1 -type f ! -name model.safetensors -exec cp {} /tmp/soup-small/ \;
# Small files first, the one model last: if anything is left out, it is the
# tail of the model, which the next call can make again.
files=()
for t in "${runs[@]}"; do
	files+=("ab-$t/log")
	[ -f /tmp/ab-$t/results.tar.gz ] && files+=("ab-$t/results.tar.gz")
done
files+=(soup-small)
[ -d /tmp/best ] && files+=(best)
(cd /tmp && tar cf - "${files[@]}") | split -b 15M -d - "$O/ab.tar.part-"
ls -la "$O"
