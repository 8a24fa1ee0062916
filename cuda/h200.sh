#!/bin/bash
# H200 runs for package cuda. Build on the dev machine first:
#   bash cuda/build_device.sh     # → .carry/cuda/{cuda.test,chunlian}
# then, through the device tool, with carry [".carry/cuda"]:
#   bash cuda/h200.sh smoke   # ~3 min: GPU tests, kernel benchmarks, short HTTP + HF smoke
#   bash cuda/h200.sh full    # ~8 min: the whole benchmark, side by side
#   bash cuda/h200.sh s3      # ≤ 420 s: everything side by side: GPU tests,
#                             # transformers baselines, HTTP 1..1000 users for this build,
#                             # the previous build ($BASE, see build_device.sh) and naive,
#                             # engine lines, couplet pipeline with a CPU profile
#   bash cuda/h200.sh wide    # ≤ 140 s: the wide-step server, 1 user and 300/1000/2000 users,
#                             # /metrics around each; then the BASE build at the same levels
#   bash cuda/h200.sh async   # ≤ 330 s: the async-launch GPU tests and LaunchDraw benchmark,
#                             # then this build and the BASE build alternately, twice each,
#                             # at 1/300/1000/1300/1600/2000 users (WIDE_LEVELS overrides)
#   bash cuda/h200.sh spin    # ≤ 330 s: every GPU test, then the wide server at 1/10/100/1000
#                             # users, default hand-off spin against --gpu-handoff-spin=2ms
#                             # (alternating, twice), then --block-size 1 against 16
#   bash cuda/h200.sh bisect  # the cuda.test binaries of cuda/bisect_device.sh, oldest first:
#                             # which commit first fails $BISECT_BENCH
#   bash cuda/h200.sh memcheck # ≤ 420 s: $BISECT_BENCH of this build (.carry/cuda/memcheck.test.gz,
#                             # see bisect_device.sh) alone, twice; under compute-sanitizer
#                             # memcheck and initcheck; after the GPU tests; then the first
#                             # and last bisect binaries alone (MC_INIT=0: no initcheck,
#                             # MC_BISECT=0: no bisect binaries, MC_FULL=1: then the whole
#                             # LaunchDraw benchmark, 200 iterations)
#   bash cuda/h200.sh fillcheck # ≤ 420 s: TestFillContextGPU (+ ForwardMatchesCPU), then
#                             # each model and precision under initcheck, the
#                             # LaunchDraw benchmark under initcheck, the test under memcheck
#   bash cuda/h200.sh s2      # ≤ 280 s: GPU tests, decode-step benchmarks (fused GEMV
#                             # vs the cuBLAS path, same process), HTTP 1/10/100/1000
#                             # users (new defaults) and 1/100 (old path), engine lines
#                             # and couplet pipeline new vs old, with a CPU profile
# Logs, JSON and Markdown are written to /tmp/h200 and packed into
# $OUT/results.tgz (the device tool brings back at most 8 files).
set -u
MODE=${1:-smoke}
RES=${OUT:-/tmp}
OUT=/tmp/h200
rm -rf "$OUT"; mkdir -p "$OUT"
BIN=.carry/cuda
export CHUNLIAN_CUDA_LIB_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export PYTHONUNBUFFERED=1
SF="--model weights/chunlian-base --backend cuda --max-num-seqs 1024 --max-num-batched-tokens 8192 --max-queue 8192 --kv-cache-memory 8GiB"
# The wide-step server of s3 and wide (its own process on a known port).
SFW="--model weights/chunlian-base --backend cuda --max-num-seqs 4096 --max-num-batched-tokens 16384 --max-queue 16384 --kv-cache-memory 16GiB --addr 127.0.0.1:18080 --log-level warn"

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
nproc
# GPU utilisation/memory once a second for the whole run (NVML via nvidia-smi).
nvidia-smi dmon -s um -d 1 -o T > "$OUT/dmon.txt" 2>&1 &
DMON=$!
trap 'kill $DMON 2>/dev/null; tar czf "$RES/results.tgz" -C "$OUT" .' EXIT
# pack: refresh $RES/results.tgz after each stage, so a run killed at the
# device tool's limit (SIGKILL: no EXIT trap) still brings back what it did.
pack() { tar czf "$RES/results.tgz" -C "$OUT" . 2>/dev/null; }
# serve_wide BIN LOG [flags]: start BIN's wide-step server ($SFW) in the
# background (its pid in SPID) and wait until it is ready (30 s at most).
serve_wide() {
	local bin=$1 log=$2; shift 2
	$bin serve $SFW "$@" > "$log" 2>&1 &
	SPID=$!
	for i in $(seq 60); do curl -sf http://127.0.0.1:18080/ready > /dev/null && break; sleep 0.5; done
}

# bench_levels TAG: chunlian bench against the server on :18080 at each of
# $LEVELS users (5 s + 1 s warm-up), /metrics scraped before and after each
# level (metrics_TAG_C_{a,b}.txt: engine step phases, computed rows), a 3 s
# CPU profile inside the 2000-user window (serve_TAG_2000.cpu.prof).
bench_levels() {
	local tag=$1 C PP
	for C in $LEVELS; do
		curl -s http://127.0.0.1:18080/metrics > "$OUT/metrics_${tag}_${C}_a.txt"
		PP=
		if [ "$C" = 2000 ]; then
			(sleep 2.5; curl -s -o "$OUT/serve_${tag}_2000.cpu.prof" "http://127.0.0.1:18080/debug/pprof/profile?seconds=3") &
			PP=$!
		fi
		timeout 20 /tmp/chunlian bench --url http://127.0.0.1:18080 --concurrency $C --duration 5s \
			--warmup 1s --quiet --json "$OUT/http_${tag}_$C.json" --out "$OUT/http_${tag}_$C.md" > "$OUT/http_${tag}_$C.log" 2>&1
		curl -s http://127.0.0.1:18080/metrics > "$OUT/metrics_${tag}_${C}_b.txt"
		echo -n "$tag: "; grep -E "^\| target" "$OUT/http_${tag}_$C.md" | tail -1
		if [ -n "$PP" ]; then wait $PP; fi
	done
}

# tests_bench TESTS BENCH: copy the binaries (gunzipped if need be) into /tmp, then run
# the GPU tests matching TESTS and the benchmarks matching BENCH.
tests_bench() {
	cp .carry/cuda/BUILD.txt .carry/cuda/BASE.txt "$OUT/" 2>/dev/null
	for f in $BIN/*.gz; do [ -e "$f" ] && gunzip -c "$f" > "/tmp/$(basename "$f" .gz)" && chmod +x "/tmp/$(basename "$f" .gz)"; done
	for f in chunlian cuda.test; do [ -e "$BIN/$f" ] && cp "$BIN/$f" /tmp/; done  # built without BASE: not gzipped
	timeout 90 /tmp/cuda.test -test.run "$1" -test.v -test.count 1 > "$OUT/cuda_test.log" 2>&1
	echo "tests rc=$?"; grep -E "^(--- |ok|FAIL|PASS|panic)|WaitStats" "$OUT/cuda_test.log" | head -40
	timeout 40 /tmp/cuda.test -test.run XXX -test.bench "$2" -test.benchtime 200x > "$OUT/draw_bench.log" 2>&1
	grep -E "^Benchmark" "$OUT/draw_bench.log" | cut -c1-160
	pack
}

case "$MODE" in
smoke)
	# (no head in this pipeline: closing it early kills the tests by SIGPIPE)
	timeout 150 $BIN/cuda.test -test.v -test.count 1 > "$OUT/cuda_test.log" 2>&1
	grep -E "^(--- |PASS|FAIL|ok)|panic|graphs:" "$OUT/cuda_test.log"
	timeout 60 $BIN/cuda.test -test.run XXX -test.bench . -test.benchtime 30x 2>&1 | tee "$OUT/cuda_bench.log" | grep -E "Benchmark|device"
	timeout 45 $BIN/chunlian bench --spawn engine --server-flags "$SF" --concurrency 1,100 --duration 3s --warmup 1s \
		--server-log-dir "$OUT" --quiet --out "$OUT/http_smoke.md" 2>&1 | tail -5
	cat "$OUT/http_smoke.md" 2>/dev/null | head -30
	timeout 60 python3 bench/hf_baseline.py --model weights/chunlian-base --seq-requests 5 --batches 128 \
		--batch-repeats 1 --json "$OUT/hf_smoke.json" 2>&1 | tail -12
	;;
full)
	timeout 60 $BIN/cuda.test -test.run 'TestDefaultModel|TestNVML|TestEngineGreedy' -test.v > "$OUT/cuda_test2.log" 2>&1
	grep -E "^(--- |ok|FAIL|PASS)|worst|{Name" "$OUT/cuda_test2.log" | cut -c1-160
	timeout 150 python3 bench/hf_baseline.py --model weights/chunlian-base --seq-requests 50 --batches 128,1024 \
		--batch-repeats 5 --json "$OUT/hf.json" > "$OUT/hf.log" 2>&1
	timeout 120 $BIN/cuda.test -test.run XXX -test.bench EngineLines -test.benchtime 3x > "$OUT/engine_lines.log" 2>&1
	timeout 60 $BIN/cuda.test -test.run XXX -test.bench 'DecodeStep|Prefill' -test.benchtime 100x > "$OUT/cuda_bench.log" 2>&1
	timeout 60 $BIN/cuda.test -test.run XXX -test.bench Couplets -test.benchtime 3s \
		-test.cpuprofile "$OUT/couplets.cpu.prof" > "$OUT/couplets.log" 2>&1
	timeout 200 $BIN/chunlian bench --spawn engine --server-flags "$SF" --concurrency 1,10,100,1000 --duration 10s \
		--warmup 2s --server-log-dir "$OUT" --quiet --json "$OUT/engine.json" --out "$OUT/engine.md" > "$OUT/engine.log" 2>&1
	timeout 120 $BIN/chunlian bench --spawn naive --server-flags "$SF" --concurrency 1,10,100 --duration 10s \
		--warmup 2s --server-log-dir "$OUT" --quiet --json "$OUT/naive.json" --out "$OUT/naive.md" > "$OUT/naive.log" 2>&1
	cp "$BIN/cuda.test" "$OUT/" # symbols for the profile
	grep -hE "^Benchmark" "$OUT/engine_lines.log" "$OUT/cuda_bench.log" "$OUT/couplets.log"
	tail -9 "$OUT/hf.log"
	grep -E "^\| engine|^\| naive" "$OUT/engine.md" "$OUT/naive.md"
	;;
s2)
	cp .carry/cuda/BUILD.txt "$OUT/" 2>/dev/null
	# Preflight in its own process: does the device's NVRTC build the
	# kernels as sm_90 CUBIN? (NVRTC 11.8 crashes there.) If not, every
	# later process loads PTX through the driver's JIT instead.
	CHUNLIAN_CUDA_TEST_ARCH=sm_90 timeout 40 $BIN/cuda.test -test.run 'TestKernelsCompile$' -test.v > "$OUT/preflight.log" 2>&1
	PRC=$?
	if [ $PRC -ne 0 ]; then export CHUNLIAN_CUDA_NVRTC_TARGET=ptx; fi
	echo "preflight rc=$PRC NVRTC target=${CHUNLIAN_CUDA_NVRTC_TARGET:-cubin}"; grep -E "^(--- |ok|FAIL)|NVRTC" "$OUT/preflight.log" | head -5
	timeout 60 $BIN/cuda.test -test.v -test.count 1 > "$OUT/cuda_test.log" 2>&1
	echo "tests rc=$?"
	grep -E "^(--- |PASS|FAIL|ok)|panic|--- FAIL|_test.go:[0-9]+: .*(want|differs|>)" "$OUT/cuda_test.log" | cut -c1-220 | head -50
	pack
	timeout 50 $BIN/cuda.test -test.run XXX -test.bench DecodeStep -test.benchtime 100x -test.count 2 > "$OUT/decode_bench.log" 2>&1
	grep -E "^Benchmark|SmallBatchPath:|FAIL|panic" "$OUT/decode_bench.log" | sed -E 's/Libraries:\[[^]]*\]//' | cut -c1-200
	pack
	timeout 40 $BIN/chunlian bench --spawn engine --server-flags "$SF" --concurrency 1,10,100,1000 --duration 5s \
		--warmup 1s --server-log-dir "$OUT" --quiet --json "$OUT/http_new.json" --out "$OUT/http_new.md" > "$OUT/http_new.log" 2>&1
	echo "http new rc=$?"; grep -E "^\| engine" "$OUT/http_new.md"
	pack
	timeout 25 $BIN/chunlian bench --spawn engine --server-flags "$SF --gpu-handoff-spin=-1ns" \
		--concurrency 1,100 --duration 5s --warmup 1s --quiet --json "$OUT/http_old.json" --out "$OUT/http_old.md" > "$OUT/http_old.log" 2>&1
	echo "http old rc=$?"; grep -E "^\| engine" "$OUT/http_old.md"
	pack
	timeout 40 $BIN/cuda.test -test.run XXX -test.bench EngineLines -test.benchtime 3x > "$OUT/engine_lines.log" 2>&1
	grep -E "^Benchmark" "$OUT/engine_lines.log" | cut -c1-170
	pack
	timeout 35 $BIN/cuda.test -test.run XXX -test.bench Couplets -test.benchtime 2s \
		-test.cpuprofile "$OUT/couplets.cpu.prof" > "$OUT/couplets.log" 2>&1
	grep -E "^Benchmark" "$OUT/couplets.log" | cut -c1-170
	cp "$BIN/cuda.test" "$OUT/" # symbols for the profile
	;;
s3)
	cp .carry/cuda/BUILD.txt "$OUT/" 2>/dev/null
	# Binaries travel gzipped (two chunlian builds + cuda.test + the tree's
	# 33 MB of weights must fit the device tool's 64 MiB).
	for f in $BIN/*.gz; do [ -e "$f" ] && gunzip -c "$f" > "/tmp/$(basename "$f" .gz)" && chmod +x "/tmp/$(basename "$f" .gz)"; done
	for f in chunlian cuda.test; do [ -e "$BIN/$f" ] && cp "$BIN/$f" /tmp/; done  # built without BASE: not gzipped
	X=/tmp
	timeout 60 $X/cuda.test -test.v -test.count 1 -test.run "${S3_TESTS:-.}" > "$OUT/cuda_test.log" 2>&1
	echo "tests rc=$?"
	grep -E "^(--- |PASS|FAIL|ok)|panic|--- FAIL" "$OUT/cuda_test.log" | cut -c1-200 | head -40
	pack
	if [ "${S3_HF:-1}" = 1 ]; then
	timeout 120 python3 bench/hf_baseline.py --model weights/chunlian-base --seq-requests 30 --batches 128,1024 \
		--batch-repeats 3 --json "$OUT/hf.json" > "$OUT/hf.log" 2>&1
	echo "hf rc=$?"; tail -12 "$OUT/hf.log"
	fi
	pack
	L=1,10,100,300,1000
	timeout 50 $X/chunlian bench --spawn engine --server-flags "$SF" --concurrency $L --duration 5s \
		--warmup 1s --server-log-dir "$OUT" --quiet --json "$OUT/http_new.json" --out "$OUT/http_new.md" > "$OUT/http_new.log" 2>&1
	echo "http new rc=$?"; grep -E "^\| engine" "$OUT/http_new.md"
	pack
	if [ "${S3_BASE:-1}" = 1 ]; then
	timeout 50 $X/chunlian-base bench --spawn engine --server-flags "$SF" --concurrency $L --duration 5s \
		--warmup 1s --quiet --json "$OUT/http_base.json" --out "$OUT/http_base.md" > "$OUT/http_base.log" 2>&1
	rc=$?; echo "http base ($(head -1 $BIN/BASE.txt 2>/dev/null)) rc=$rc"; grep -E "^\| engine" "$OUT/http_base.md"
	pack
	fi
	# Wider steps for the many-user levels: the 横批 stage runs 1 + 4
	# sequences per couplet, so 1000 users need more than 1024 per step.
	# A server of our own (known port, --pprof) so that a CPU profile can be
	# taken under load.
	serve_wide $X/chunlian "$OUT/serve_wide.log" --pprof
	timeout 60 $X/chunlian bench --url http://127.0.0.1:18080 --concurrency ${S3_WIDE:-300,1000,2000,3000} --duration 5s \
		--warmup 1s --quiet --json "$OUT/http_wide.json" --out "$OUT/http_wide.md" > "$OUT/http_wide.log" 2>&1
	echo "http wide rc=$?"; grep -E "^\| " "$OUT/http_wide.md" | grep -E "users"
	pack
	(sleep 3; curl -s -o "$OUT/serve_2000.cpu.prof" "http://127.0.0.1:18080/debug/pprof/profile?seconds=6") &
	CPID=$!
	timeout 20 $X/chunlian bench --url http://127.0.0.1:18080 --concurrency 2000 --duration 10s \
		--warmup 1s --quiet --json "$OUT/http_prof.json" --out "$OUT/http_prof.md" > "$OUT/http_prof.log" 2>&1
	wait $CPID 2>/dev/null
	kill $SPID; wait $SPID 2>/dev/null
	# (symbols for the profiles: the carried .carry/cuda/*.gz binaries)
	pack
	timeout 30 $X/chunlian bench --spawn naive --server-flags "$SF" --concurrency 1,10 --duration 5s \
		--warmup 1s --quiet --json "$OUT/http_naive.json" --out "$OUT/http_naive.md" > "$OUT/http_naive.log" 2>&1
	echo "http naive rc=$?"; grep -E "^\| naive" "$OUT/http_naive.md"
	pack
	timeout 45 $X/cuda.test -test.run XXX -test.bench EngineLines -test.benchtime 3x > "$OUT/engine_lines.log" 2>&1
	grep -E "^Benchmark" "$OUT/engine_lines.log" | cut -c1-170
	pack
	if [ "${S3_COUPLETS:-1}" = 1 ]; then
	timeout 35 $X/cuda.test -test.run XXX -test.bench Couplets -test.benchtime 2s \
		-test.cpuprofile "$OUT/couplets.cpu.prof" > "$OUT/couplets.log" 2>&1
	grep -E "^Benchmark" "$OUT/couplets.log" | cut -c1-170
	fi
	;;
wide)
	# ≤ 90 s: one couplet and the wide-step server at 300, 1000 and 2000 users
	# (a quick check of a host-side change; binaries as for s3).
	cp .carry/cuda/BUILD.txt "$OUT/" 2>/dev/null
	gunzip -c $BIN/chunlian.gz > /tmp/chunlian && chmod +x /tmp/chunlian
	if [ -f $BIN/cuda.test.gz ]; then # GPU = CPU through the engine (prefix-cache hits included)
		gunzip -c $BIN/cuda.test.gz > /tmp/cuda.test && chmod +x /tmp/cuda.test
		timeout 60 /tmp/cuda.test -test.run 'TestEngineGreedy|TestDefaultModelMatchesCPU' -test.v -test.count 1 > "$OUT/cuda_test.log" 2>&1
		grep -E "^(--- |ok|FAIL|PASS)" "$OUT/cuda_test.log"
	fi
	serve_wide /tmp/chunlian "$OUT/serve_wide.log" --pprof
	LEVELS=${WIDE_LEVELS:-1 300 1000 2000}
	bench_levels wide
	pack
	kill $SPID; wait $SPID 2>/dev/null
	# The comparison build (BASE=<commit> bash cuda/build_device.sh), same flags.
	if [ -f $BIN/chunlian-base.gz ]; then
		gunzip -c $BIN/chunlian-base.gz > /tmp/chunlian-base && chmod +x /tmp/chunlian-base
		cp $BIN/BASE.txt "$OUT/" 2>/dev/null
		serve_wide /tmp/chunlian-base "$OUT/serve_base.log"
		timeout 45 /tmp/chunlian bench --url http://127.0.0.1:18080 --concurrency $(echo $LEVELS | tr ' ' ,) --duration 5s \
			--warmup 1s --quiet --json "$OUT/http_base.json" --out "$OUT/http_base.md" > "$OUT/http_base.log" 2>&1
		echo "base:"; grep -E "^\| target" "$OUT/http_base.md"
		kill $SPID; wait $SPID 2>/dev/null
	fi
	;;
async)
	# This build (new) against the BASE build (base), alternating new, base,
	# new, base so that neither always runs first; same wide-server flags.
	tests_bench 'Draw|Async|TestEngineGreedy|TestDefaultModelMatchesCPU' 'LaunchDraw'
	LEVELS=${WIDE_LEVELS:-1 300 1000 1300 1600 2000}
	for R in 1 2; do
		for V in new base; do
			B=/tmp/chunlian
			[ $V = base ] && B=/tmp/chunlian-base
			serve_wide $B "$OUT/serve_${V}_$R.log" --pprof
			bench_levels $V$R
			kill $SPID; wait $SPID 2>/dev/null
			pack
		done
	done
	;;
spin)
	# Every GPU test, then the same binary with its default hand-off spin
	# against --gpu-handoff-spin=2ms, alternating dflt, spin2, dflt, spin2
	# (written when the default was 300 µs; with today's 2 ms default, edit
	# spin2's flag to the value to compare). Last, KV block size 1 against the default 16
	# (every slot is live at 1; is 1 slower on the GPU?).
	tests_bench '.' 'LaunchDraw'
	LEVELS=${WIDE_LEVELS:-1 10 100 1000}
	for R in 1 2; do
		for V in dflt spin2; do
			F=; [ $V = spin2 ] && F=--gpu-handoff-spin=2ms
			serve_wide /tmp/chunlian "$OUT/serve_${V}_$R.log" $F
			bench_levels $V$R
			kill $SPID; wait $SPID 2>/dev/null
			pack
		done
	done
	LEVELS="10 1000"
	for V in b16 b1; do
		F=; [ $V = b1 ] && F="--block-size 1 --gpu-max-blocks 1048576"  # as many tokens as 16 × the default cap
		serve_wide /tmp/chunlian "$OUT/serve_$V.log" $F
		bench_levels $V
		kill $SPID; wait $SPID 2>/dev/null
		pack
	done
	;;
bisect)
	# The binaries of cuda/bisect_device.sh, oldest first: each runs
	# $BISECT_BENCH (default: BenchmarkLaunchDraw/seqs=64) and
	# prints ok or FAIL with its first error line.
	for f in $(awk '!/^#/ {print $1}' $BIN/bisect/ORDER.txt); do
		gunzip -c "$BIN/bisect/$f.test.gz" > /tmp/bisect.test && chmod +x /tmp/bisect.test
		timeout 60 /tmp/bisect.test -test.run XXX -test.bench "${BISECT_BENCH:-LaunchDraw/seqs=64}" -test.benchtime 5x > "$OUT/bisect_$f.log" 2>&1
		if grep -q "^--- FAIL" "$OUT/bisect_$f.log"; then
			echo "$f FAIL: $(grep -m1 -A1 '^--- FAIL' "$OUT/bisect_$f.log" | tail -1)"
		else
			echo "$f ok: $(grep -m1 '^Benchmark' "$OUT/bisect_$f.log" | cut -c1-100)"
		fi
		pack
	done
	;;
memcheck)
	# $BISECT_BENCH alone and under compute-sanitizer: which kernel touches
	# what, and does the benchmark read device memory nobody wrote (its KV
	# blocks)? Written for a failure of LaunchDraw's first ForwardDraw
	# (INVALID_VALUE on the copy of the draws, ILLEGAL_ADDRESS at the sync).
	B=${BISECT_BENCH:-LaunchDraw/seqs=64}
	gunzip -c $BIN/memcheck.test.gz > /tmp/mc.test && chmod +x /tmp/mc.test
	one() {  # one LOG ARGS...: run, then print ok/FAIL with the first error
		local log=$1; shift
		timeout 150 "$@" > "$OUT/$log.log" 2>&1
		echo "$log rc=$?: $(grep -m1 -A1 '^--- FAIL' "$OUT/$log.log" | tail -1 | cut -c1-200)$(grep -m1 '^Benchmark' "$OUT/$log.log" | cut -c1-100)"
		grep -m3 -E "ERROR SUMMARY|Invalid|Uninitialized" "$OUT/$log.log" | cut -c1-200
		pack
	}
	one alone1 /tmp/mc.test -test.run XXX -test.bench "$B" -test.benchtime 5x
	one alone2 /tmp/mc.test -test.run XXX -test.bench "$B" -test.benchtime 5x
	CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
	echo "compute-sanitizer: ${CS:-none}"
	if [ -n "$CS" ]; then
		one memcheck "$CS" --tool memcheck --print-limit 20 /tmp/mc.test -test.run XXX -test.bench "$B/sync" -test.benchtime 1x
		[ "${MC_INIT:-1}" = 0 ] || one initcheck "$CS" --tool initcheck --print-limit 20 /tmp/mc.test -test.run XXX -test.bench "$B/sync" -test.benchtime 1x
	fi
	timeout 90 /tmp/mc.test -test.run . -test.count 1 > "$OUT/tests.log" 2>&1
	echo "tests rc=$?: $(grep -cE '^--- FAIL' "$OUT/tests.log") FAIL"
	one after_tests /tmp/mc.test -test.run XXX -test.bench "$B" -test.benchtime 5x
	[ "${MC_FULL:-0}" = 1 ] && one launchdraw /tmp/mc.test -test.run XXX -test.bench LaunchDraw -test.benchtime 200x
	bis=; [ "${MC_BISECT:-1}" = 0 ] || bis=$(awk '!/^#/ {print $1}' $BIN/bisect/ORDER.txt 2>/dev/null | sed -n '1p;$p')
	for f in $bis; do
		gunzip -c "$BIN/bisect/$f.test.gz" > /tmp/bisect.test && chmod +x /tmp/bisect.test
		one "bisect_$f" /tmp/bisect.test -test.run XXX -test.bench "$B" -test.benchtime 5x
	done
	;;
fillcheck)
	# initcheck flags 4-byte reads of qkv rows in rope_kv
	# during fillContext's prefill (1,472 tokens, the cuBLAS path, in a
	# graph). TestFillContextGPU checks those rows numerically (decode
	# after the fill = the CPU's whole prefill) at fp32 and tf32; then each
	# precision runs again under initcheck, and the whole test under
	# memcheck. Reports at tf32 but none at fp32 mean initcheck does not
	# see the tensor-core GEMM's stores; reports at both, with the numbers
	# right, mean rope_kv reads rows no kernel wrote that do not matter.
	CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
	echo "compute-sanitizer: ${CS:-none}"
	tests_bench 'FillContext|ForwardMatchesCPU' XXX
	for p in test-config/fp32 test-config/tf32 bench-model/fp32 bench-model/tf32; do
		timeout 120 "$CS" --tool initcheck --print-limit 30 /tmp/cuda.test -test.run "FillContextGPU/$p" -test.v > "$OUT/initcheck_${p/\//_}.log" 2>&1
		echo "initcheck $p rc=$?: $(grep -m1 "ERROR SUMMARY" "$OUT/initcheck_${p/\//_}.log") $(grep -m1 -E '^(--- |ok|FAIL)' "$OUT/initcheck_${p/\//_}.log")"
		grep -E "^=========     at " "$OUT/initcheck_${p/\//_}.log" | sort | uniq -c | head -5
		pack
	done
	# LaunchDraw under initcheck, for comparison.
	timeout 120 "$CS" --tool initcheck --print-limit 30 /tmp/cuda.test -test.run XXX -test.bench LaunchDraw/seqs=64/sync -test.benchtime 1x > "$OUT/initcheck_launchdraw.log" 2>&1
	echo "initcheck LaunchDraw rc=$?: $(grep -m1 "ERROR SUMMARY" "$OUT/initcheck_launchdraw.log")"
	grep -E "^=========     at " "$OUT/initcheck_launchdraw.log" | sort | uniq -c | head -5
	pack
	timeout 120 "$CS" --tool memcheck --print-limit 30 /tmp/cuda.test -test.run "FillContextGPU" -test.v > "$OUT/memcheck.log" 2>&1
	echo "memcheck rc=$?: $(grep -m1 "ERROR SUMMARY" "$OUT/memcheck.log")"
	;;
host)
	# Host-bound parts again (binaries built with GOEXPERIMENT=simd, see
	# build_device.sh): engine lines, couplet pipeline profile, HTTP.
	timeout 90 $BIN/cuda.test -test.run XXX -test.bench EngineLines -test.benchtime 3x > "$OUT/engine_lines.log" 2>&1
	timeout 40 $BIN/cuda.test -test.run XXX -test.bench Couplets -test.benchtime 3s \
		-test.cpuprofile "$OUT/couplets.cpu.prof" > "$OUT/couplets.log" 2>&1
	timeout 150 $BIN/chunlian bench --spawn engine --server-flags "$SF" --concurrency 1,10,100,1000 --duration 10s \
		--warmup 2s --server-log-dir "$OUT" --quiet --json "$OUT/engine.json" --out "$OUT/engine.md" > "$OUT/engine.log" 2>&1
	timeout 50 $BIN/chunlian bench --spawn naive --server-flags "$SF" --concurrency 1,10 --duration 10s \
		--warmup 2s --server-log-dir "$OUT" --quiet --json "$OUT/naive.json" --out "$OUT/naive.md" > "$OUT/naive.log" 2>&1
	cp "$BIN/cuda.test" "$OUT/"
	grep -hE "^Benchmark" "$OUT/engine_lines.log" "$OUT/couplets.log"
	grep -E "^\| engine|^\| naive" "$OUT/engine.md" "$OUT/naive.md"
	;;
esac
kill $DMON 2>/dev/null
tail -5 "$OUT/dmon.txt"
