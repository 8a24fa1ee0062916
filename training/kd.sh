#!/bin/bash
# Sequence-level self-distillation in one device call (training/distill.py):
# 1. measure: validation BLEU-4 of the teacher's greedy and beam decoding
#    (widths $KD_MEASURE, default 1,2,4,8; KD_MEASURE= skips it: ~30 s a
#    width on the H200) -> $OUT/measure.txt;
# 2. make: the teacher's width-$KD_K beam 下联 of every training pair ->
#    /tmp/kd_train.tsv (made on the device: ~25 MB would not fit the carry);
# 3. training/ab.sh with the given runs, each of which may name the file
#    with --kd /tmp/kd_train.tsv.
#
#   # device tool: run(command=..., carry=[".carry/chunlian"], timeout_s=600)
#   KD_TEACHER=weights/chunlian-base KD_K=8 KD_MEASURE= AB_SMOKE=0 AB_SOUP=0 \
#     bash training/kd.sh "$B --kd /tmp/kd_train.tsv --kd-frac 0.5 ..." ["<run b>" ...]
#
# The teacher defaults to the shipped model; ab.sh's environment knobs pass
# through. Nothing here reads test.tsv (ab.sh's runs report it, never choose on it).
set -u -o pipefail  # a failed distill.py fails its pipeline through tee
O=${OUT:?OUT must name the folder that comes back}
teacher=${KD_TEACHER:-weights/chunlian-base}
start=$(date +%s)
: > "$O/measure.txt"
if [ -n "${KD_MEASURE-1,2,4,8}" ]; then
	PYTHONUNBUFFERED=1 python3 training/distill.py measure --models "$teacher" --k "${KD_MEASURE-1,2,4,8}" \
		2>&1 | tee "$O/measure.txt"
fi
PYTHONUNBUFFERED=1 python3 training/distill.py make --models "$teacher" --k "${KD_K:-4}" --out /tmp/kd_train.tsv \
	2>&1 | tee -a "$O/measure.txt" || exit 1
[ -s /tmp/kd_train.tsv ] || { echo "kd.sh: no /tmp/kd_train.tsv" >&2; exit 1; }
head -n 5 /tmp/kd_train.tsv >> "$O/measure.txt"
took=$(($(date +%s) - start))
# ab.sh's runs get what is left of KD_BUDGET seconds (default 560, for a
# 600 s device call) after this, less 45 s for ab.sh's ranking and packing,
# unless AB_DEADLINE is given. Session 11's first call gave them a fixed
# 400 s after 239 s of measure + make, and the device call's limit killed
# everything before a byte came back.
export AB_DEADLINE=${AB_DEADLINE:-$((${KD_BUDGET:-560} - took - 45))}
echo "kd.sh: measure + make took $took s; the runs get AB_DEADLINE=$AB_DEADLINE s" | tee -a "$O/measure.txt"
exec bash training/ab.sh "$@"
