#!/usr/bin/env bash
# Throughput of 1, 2 and 4 chunlian replicas on one Linux host, CPU backend,
# each replica pinned to its own cores with taskset. For a host without
# nginx or network: each replica gets its own `chunlian bench` (pinned to
# cores no replica uses), all run at once, and the report sums them; that is
# what a balancer in front would deliver, minus the balancer's own cost.
#
#   deploy/bench-replicas.sh                      # ./chunlian, 16-core host: about 3 minutes
#   CHUNLIAN=/path/to/chunlian OUT=/tmp/br deploy/bench-replicas.sh
#
# Two series, 1/2/4 replicas each:
#   scale: every replica has CORES_PER_REPLICA cores (default 3, --threads 3):
#          N replicas use N× the cores of one; the goal is N× the throughput
#          (issue: ≥ 0.8·N). 4 × 3 = 12 server cores, clients on the rest.
#   split: SERVER_CORES (default 12) split among N replicas (--threads 12/N):
#          is one big replica or several small ones better on the same cores?
# Each run: a closed loop of USERS_PER_CORE (default 8) users per server core
# per replica (the 2-core knee is ~16-32 users) for DURATION (default 15s)
# after a 3 s warm-up. Needs: bash, python3, taskset (util-linux; without
# it the replicas run unpinned, with a warning).
# SMOKE=1 lets it run on a small machine (clients share the servers' cores).
#
# GPUs (one replica per GPU, issue 25): BACKEND=cuda gives replica i
# `--backend cuda --device i` (plus its CORES_PER_REPLICA host cores), e.g.
#   BACKEND=cuda SERIES=scale REPLICAS="1 2 4 8" CORES_PER_REPLICA=8 SERVER_CORES=64 USERS=1200 deploy/bench-replicas.sh
# USERS sets the closed-loop users per replica directly. GPUS=G puts
# replica i on device i mod G (GPUS=1: every replica shares GPU 0), and
# SERVER_FLAGS are added to every replica's serve flags.
# Output: a Markdown table on stdout and in $OUT/summary.md, raw bench JSON
# and server logs in $OUT.
set -euo pipefail

CHUNLIAN=${CHUNLIAN:-./chunlian}
OUT=${OUT:-/tmp/chunlian-bench-replicas}
CORES_PER_REPLICA=${CORES_PER_REPLICA:-3}
SERVER_CORES=${SERVER_CORES:-12}
USERS_PER_CORE=${USERS_PER_CORE:-8}
DURATION=${DURATION:-15s}
SERIES=${SERIES:-"scale split"}
REPLICAS=${REPLICAS:-"1 2 4"}
BASE_PORT=${BASE_PORT:-18100}
BACKEND=${BACKEND:-cpu}
USERS=${USERS:-}
GPUS=${GPUS:-}
SERVER_FLAGS=${SERVER_FLAGS:-}

ncpu=$(nproc)
need=$(( SERVER_CORES + 2 ))
if [ "$ncpu" -lt "$need" ] && [ "${SMOKE:-0}" != 1 ]; then
  echo "bench-replicas: $ncpu cores; need $need (SERVER_CORES=$SERVER_CORES + 2 for the clients)" >&2
  exit 2
fi
command -v python3 >/dev/null || { echo "bench-replicas: python3 missing" >&2; exit 2; }
# pin CPUS CMD…: run CMD on CPUS. Only ever called with & : the exec makes
# the background job's pid the command's own, so cleanup's kill reaches it.
pin() { local cpus=$1; shift; exec taskset -c "$cpus" "$@"; }
if ! command -v taskset >/dev/null; then
  echo "bench-replicas: taskset missing: replicas and clients run UNPINNED (figures less clean)" >&2
  pin() { shift; exec "$@"; }
fi
# ready PORT: /ready answers 200 (python3, since curl may be absent)
ready() {
  python3 -c 'import sys, urllib.request
try: sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception: sys.exit(1)' "http://127.0.0.1:$1/ready"
}
[ -x "$CHUNLIAN" ] || { echo "bench-replicas: no binary at $CHUNLIAN (set CHUNLIAN=)" >&2; exit 2; }
mkdir -p "$OUT"
client_cpus="$SERVER_CORES-$(( ncpu - 1 ))"
# SMOKE=1: clients share the servers' cores (a check of the script on a
# small machine; its figures mean nothing)
[ "${SMOKE:-0}" = 1 ] && client_cpus="0-$(( ncpu - 1 ))"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# run SERIES N CORES_EACH: N replicas with CORES_EACH cores each, N benches at once.
run() {
  local series=$1 n=$2 each=$3 tag="$1-$2" i first last users
  pids=()
  for i in $(seq 0 $(( n - 1 ))); do
    first=$(( i * each )) last=$(( i * each + each - 1 ))
    local dev=()
    [ "$BACKEND" = cuda ] && dev=(--device "$(( GPUS ? i % GPUS : i ))")
    # shellcheck disable=SC2086 # SERVER_FLAGS is a list of flags
    pin "$first-$last" "$CHUNLIAN" serve --backend "$BACKEND" "${dev[@]}" --addr "127.0.0.1:$(( BASE_PORT + i ))" \
      --threads "$each" --log-level warn $SERVER_FLAGS > "$OUT/$tag-server$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 0 $(( n - 1 ))); do
    local ok=0
    for _ in $(seq 1 1200); do # up to 2 min (the CUDA backend compiles its kernels at start)
      if ready $(( BASE_PORT + i )); then ok=1; break; fi
      sleep 0.1
    done
    if [ $ok = 0 ]; then
      echo "bench-replicas: replica $i never ready; its log:" >&2
      tail -20 "$OUT/$tag-server$i.log" >&2
      exit 1
    fi
  done
  users=${USERS:-$(( USERS_PER_CORE * each ))}
  local bpids=()
  for i in $(seq 0 $(( n - 1 ))); do
    pin "$client_cpus" "$CHUNLIAN" bench --url "http://127.0.0.1:$(( BASE_PORT + i ))" \
      --concurrency "$users" --duration "$DURATION" --warmup 3s --quiet \
      --json "$OUT/$tag-bench$i.json" > "$OUT/$tag-bench$i.md" 2>&1 &
    bpids+=($!)
  done
  for p in "${bpids[@]}"; do wait "$p"; done
  cleanup
  echo "$series $n $each $users" >> "$OUT/runs.txt"
}

: > "$OUT/runs.txt"
for s in $SERIES; do
  for n in $REPLICAS; do
    if [ "$s" = scale ]; then each=$CORES_PER_REPLICA; else each=$(( SERVER_CORES / n )); fi
    if [ $(( n * each )) -gt "$SERVER_CORES" ]; then
      echo "bench-replicas: $s $n × $each cores > SERVER_CORES=$SERVER_CORES, skipped" >&2
      continue
    fi
    echo "bench-replicas: $s: $n replica(s) × $each cores" >&2
    run "$s" "$n" "$each"
  done
done

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, sys, os
out = sys.argv[1]
rows, base = [], {}
for line in open(os.path.join(out, "runs.txt")):
    series, n, each, users = line.split()
    n, each, users = int(n), int(each), int(users)
    tot = fail = rej = cpu = 0.0
    p99 = 0.0
    for i in range(n):
        d = json.load(open(os.path.join(out, f"{series}-{n}-bench{i}.json")))
        lv = d["targets"][0]["levels"][0]
        tot += lv["couplets_per_s"]; fail += lv["failed"]; rej += lv["rejected"]
        cpu += lv.get("cpu_cores", 0.0); p99 = max(p99, lv["latency"]["p99_ms"])
    if n == 1:
        base[series] = tot
    scale = tot / base[series] if base.get(series) else float("nan")
    rows.append(f"| {series} | {n} | {each} | {users} | {tot:.1f} | {scale:.2f} | {scale / n:.2f} | {p99:.0f} | {cpu:.1f} | {int(fail)} | {int(rej)} |")
print("| series | replicas | cores each | users each | couplets/s (sum) | × 1 replica | per replica (÷N) | worst p99 ms | server CPU cores | failed | 503 |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
print("\n".join(rows))
PY
