#!/bin/bash
# Sequence-level self-distillation in one device call (training/distill.py):
# 1. measure: validation BLEU-4 of the teacher's greedy and beam decoding
#    (widths $KD_MEASURE, default 1,2,4,8) -> $OUT/measure.txt;
# 2. make: the teacher's width-$KD_K beam 下联 of every training pair ->
#    /tmp/kd_train.tsv (made on the device: ~25 MB would not fit the carry);
# 3. training/ab.sh with the given runs, each of which may name the file
#    with --kd /tmp/kd_train.tsv.
#
#   # device tool: run(command=..., carry=[".carry/chunlian"], timeout_s=600)
#   KD_TEACHER=weights/chunlian-base KD_K=4 AB_SMOKE=0 AB_SOUP=0 AB_DEADLINE=420 \
#     bash training/kd.sh "$B --kd /tmp/kd_train.tsv --kd-frac 0.5 ..." ["<run b>" ...]
#
# The teacher defaults to the shipped model; ab.sh's environment knobs pass
# through. Nothing here reads test.tsv (ab.sh's runs report it, never choose on it).
set -u
O=${OUT:?OUT must name the folder that comes back}
teacher=${KD_TEACHER:-weights/chunlian-base}
start=$(date +%s)
PYTHONUNBUFFERED=1 python3 training/distill.py measure --models "$teacher" --k "${KD_MEASURE:-1,2,4,8}" \
	2>&1 | tee "$O/measure.txt"
PYTHONUNBUFFERED=1 python3 training/distill.py make --models "$teacher" --k "${KD_K:-4}" --out /tmp/kd_train.tsv \
	2>&1 | tee -a "$O/measure.txt" || exit 1
[ -s /tmp/kd_train.tsv ] || { echo "kd.sh: no /tmp/kd_train.tsv" >&2; exit 1; }
head -n 5 /tmp/kd_train.tsv >> "$O/measure.txt"
echo "kd.sh: measure + make took $(($(date +%s) - start)) s" | tee -a "$O/measure.txt"
exec bash training/ab.sh "$@"
