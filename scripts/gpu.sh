#!/bin/bash
# The GPU machine's check, in two halves:
#
#   bash scripts/gpu.sh build    # here: CGO-free binaries into .carry/gpu/ (one xz stream)
#   bash scripts/gpu.sh check    # on the device, with carry [".carry/gpu"]:
#                                # the CUDA tests, the default pipeline through
#                                # HTTP (backend's default samples vs 1, same
#                                # call) and CPU replica scaling; ~2 min
#
# CUDATEST=0 for build leaves the CUDA test binary out (8 MB less to carry).
# BASE=<commit> for build also builds that commit's chunlian as
# chunlian-base; check then benches it right before HEAD's at every level
# (a same-call before/after). VARIANTS="NAME=flags;NAME=flags" for check
# benches HEAD's binary with each set of extra serve flags (as
# chunlian-NAME) right before it runs without them: A/Bs of switches in one
# binary, beside BASE or not. AB_FLAGS="..." is the variant "ab", and
# SPRING_AB=1 the variant "nospring" (--spring-model off).
# PROFILE=N adds a 6-second server CPU profile under N users ($OUT/server.prof,
# with the bench's report and the engine's counters; serve flags from
# SERVER_FLAGS and PROFILE_FLAGS); `go tool pprof server.prof` reads it as it
# is (Go profiles carry their symbols). TRACE=S (with PROFILE) adds an
# S-second execution trace right after the profile, still under load
# ($OUT/server.trace.xz; `go tool trace` reads it after unxz).
# TESTS=regexp runs only those CUDA tests. GOBENCH=regexp runs the CUDA
# test binary's benchmarks matching it after the benches ($OUT/gobench.txt;
# GOBENCH_FLAGS, default "-test.benchtime 300x -test.count 2").
# EVAL="NAME=flags;NAME=flags" evaluates HEAD's model on the GPU once per
# entry with those extra flags (an empty flags part: as shipped): BLEU and
# perplexity on the whole test set, which build carries when
# ../shared/data/couplets/test.tsv exists ($OUT/eval-NAME.txt).
# CUDATEST=0 skips the CUDA tests, BENCH=0 the benches, REPLICAS=0 the
# replica scaling; LEVELS
# (default 1,1000) sets the bench's user
# counts, SAMPLES (default "0 1") the sample counts, SERVER_FLAGS adds
# serve flags to the shipped defaults.
#
# build compiles the committed tree (git archive HEAD) with empty embedded
# weight files: the device tool moves at most 64 MiB, and the tracked weights
# already travel, so the binaries load them with --model weights/chunlian-base
# (CHUNLIAN_MODEL) and --spring-model /tmp/spring-model (CHUNLIAN_SPRING_MODEL),
# which check decodes from weights/chunlian-spring first (numpy, as
# weights.DecodeSpring). check writes summary.txt to $OUT, the raw bench
# reports as reports.tar.gz, and the logs and outputs named above.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
	T=$(mktemp -d) TB=$(mktemp -d)
	trap 'rm -rf "$T" "$TB"' EXIT
	git archive HEAD | tar -xf - -C "$T"
	: > "$T/weights/chunlian-base/model.safetensors"
	: > "$T/weights/chunlian-spring/model.safetensors.xor"
	mkdir -p .carry/gpu
	HC=$(git rev-parse --short HEAD)
	BINS="chunlian cuda.test"
	if [ "${CUDATEST:-1}" = 1 ]; then
		(cd "$T" && CGO_ENABLED=0 go test -c -ldflags="-s -w" -o "$OLDPWD/.carry/gpu/cuda.test" ./cuda/)
	else
		BINS=chunlian
	fi
	(cd "$T" && CGO_ENABLED=0 go build -ldflags="-s -w -X chunlian/buildinfo.commit=$HC" -o "$OLDPWD/.carry/gpu/chunlian" ./cmd/chunlian)
	rm -f .carry/gpu/*.gz .carry/gpu/*.xz .carry/gpu/*.size .carry/gpu/bins.txt
	if [ -n "${BASE:-}" ]; then
		BC=$(git rev-parse --short "$BASE")
		git archive "$BASE" | tar -xf - -C "$TB"
		: > "$TB/weights/chunlian-base/model.safetensors"
		[ ! -d "$TB/weights/chunlian-spring" ] || : > "$TB/weights/chunlian-spring/model.safetensors.xor"
		(cd "$TB" && CGO_ENABLED=0 go build -ldflags="-s -w -X chunlian/buildinfo.commit=$BC" -o "$OLDPWD/.carry/gpu/chunlian-base" ./cmd/chunlian)
		BINS="chunlian-base $BINS"
	fi
	# All binaries in one xz stream: they share most of their code within
	# xz's 64 MiB window (one server 7.3 MiB; two 7.5 MiB a few commits
	# apart, 8.1 MiB a day apart).
	(cd .carry/gpu && for b in $BINS; do echo "$b $(stat -c %s $b)"; done > bins.txt && cat $BINS | xz -9 -T1 > bins.xz && rm $BINS)
	# The held-out test set for EVAL (after the clean-up above).
	TS=../shared/data/couplets/test.tsv
	[ ! -f "$TS" ] || xz -9 -c "$TS" > .carry/gpu/test.tsv.xz
	{ git rev-parse HEAD; git log -1 --format=%s; [ -z "${BASE:-}" ] || echo "base: $(git rev-parse "$BASE")"; date -u; } > .carry/gpu/BUILD.txt
	ls -la .carry/gpu
	# The device tool refuses a working tree over 64 MiB counted as disk
	# blocks: the tracked files take ~56.5 MiB, so one server fits, and a
	# BASE build beside it only when the two are close. Else move tracked
	# files the check does not read out of the tree for the call (the three
	# largest sheets in quality/testdata/readings,
	# forward/testdata/reference.json and training/data/written_triples.tsv:
	# ~1.4 MiB) and restore them after it with `git checkout -- .`.
	TRAVEL=$( (git ls-files -z; find .carry/gpu -type f -print0) | du -c -B1 --files0-from=- | tail -1 | cut -f1)
	echo "travels: $((TRAVEL >> 10)) KiB of $((64 << 10)) KiB"
	[ "$TRAVEL" -le $((64 << 20)) ] || echo "gpu.sh: over the device tool's 64 MiB (see the comment above)" >&2
	;;
check)
	set +e
	: "${OUT:?OUT must name the folder that comes back}"
	B=/tmp/gpu-bin
	mkdir -p $B
	unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
	unxz .carry/gpu/bins.xz /tmp/chunlian-bins
	OFF=0
	while read -r name size; do
		tail -c +$((OFF + 1)) /tmp/chunlian-bins | head -c "$size" > $B/$name
		OFF=$((OFF + size))
	done < .carry/gpu/bins.txt
	rm /tmp/chunlian-bins
	# Every variant is HEAD's binary under another name (chunlian-NAME)
	# with extra serve flags; the benches run base, the variants, then HEAD.
	BINS=
	[ ! -f $B/chunlian-base ] || BINS=chunlian-base
	[ -z "${AB_FLAGS:-}" ] || VARIANTS="ab=$AB_FLAGS${VARIANTS:+;$VARIANTS}"
	[ "${SPRING_AB:-0}" != 1 ] || VARIANTS="nospring=--spring-model off${VARIANTS:+;$VARIANTS}"
	declare -A VFLAGS
	IFS=';' read -ra VS <<< "${VARIANTS:-}"
	for v in "${VS[@]}"; do
		[ -n "$v" ] || continue
		name=${v%%=*}
		case $name in
		'' | *[!A-Za-z0-9-]*)
			echo "VARIANTS: bad name '$name' (letters, digits and '-')" >&2
			exit 2
			;;
		esac
		ln -sf chunlian $B/chunlian-$name
		VFLAGS[chunlian-$name]=${v#*=}
		BINS="$BINS chunlian-$name"
	done
	BINS="${BINS# } chunlian"
	BINS=${BINS# }
	chmod +x $B/*
	export CHUNLIAN_CUDA_LIB_DIR=${CHUNLIAN_CUDA_LIB_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
	export CHUNLIAN_MODEL=weights/chunlian-base
	if [ -f weights/chunlian-spring/model.safetensors.xor ]; then
		SM=/tmp/spring-model
		mkdir -p $SM
		cp weights/chunlian-base/*.json weights/chunlian-base/*.txt $SM/
		python3 -c '
import sys, zlib, numpy as np
base = np.fromfile(sys.argv[1], np.uint8)
planes = np.frombuffer(zlib.decompress(open(sys.argv[2], "rb").read()), np.uint8)
assert planes.size == base.size, "spring delta and base differ in size"
out, h = np.empty_like(base), base.size // 2
out[1::2], out[0::2] = base[1::2] ^ planes[:h], base[0::2] ^ planes[h:]
out.tofile(sys.argv[3])' weights/chunlian-base/model.safetensors weights/chunlian-spring/model.safetensors.xor $SM/model.safetensors
		export CHUNLIAN_SPRING_MODEL=$SM
	fi
	S=$OUT/summary.txt
	{ cat .carry/gpu/BUILD.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $S
	T0=$(date +%s)
	if [ "${CUDATEST:-1}" = 1 ]; then
		timeout 240 $B/cuda.test -test.count 1 -test.v ${TESTS:+-test.run "$TESTS"} > $OUT/cuda_test.log 2>&1
		echo "cuda.test rc=$? ($(($(date +%s) - T0)) s)" >> $S
		grep -E "^(--- FAIL|FAIL|ok|PASS)|panic" $OUT/cuda_test.log | head -20 >> $S
	fi
	# The service as shipped: CUDA's step limits are the defaults (DECISIONS.md,
	# "Step limits on the GPU"); extra flags through SERVER_FLAGS.
	SF="--backend cuda --log-level warn ${SERVER_FLAGS:-}"
	if [ "${BENCH:-1}" = 1 ]; then
		for k in ${SAMPLES:-0 1}; do
			for bin in $BINS; do
				SMF=${VFLAGS[$bin]:-}
				timeout 100 $B/$bin bench --spawn engine --server-flags "$SF $SMF --samples-per-couplet $k" --concurrency ${LEVELS:-1,1000} \
					--duration 6s --warmup 2s --quiet --json $OUT/gpu-$bin-k$k.json --out $OUT/gpu-$bin-k$k.md > /dev/null 2>&1
				echo "$bin bench --samples-per-couplet $k (0 = the backend's default) rc=$? ($(($(date +%s) - T0)) s)" >> $S
				grep -E "^\| engine \||^- engine " $OUT/gpu-$bin-k$k.md >> $S
			done
		done
	fi
	if [ -n "${EVAL:-}" ]; then
		unxz .carry/gpu/test.tsv.xz /tmp/test.tsv
		IFS=';' read -ra ES <<< "$EVAL"
		for e in "${ES[@]}"; do
			name=${e%%=*} flags=
			[[ $e != *=* ]] || flags=${e#*=}
			timeout 150 $B/chunlian eval --backend cuda --test /tmp/test.tsv --bleu-forced 3830 --ppl-limit 3830 \
				--limit 0 --bleu-limit 0 --samples 0 --words 1 $flags > $OUT/eval-$name.txt 2>&1
			echo "eval $name ($flags) rc=$? ($(($(date +%s) - T0)) s)" >> $S
			grep -oE "BLEU-4 \*\*[0-9.]+\*\*|\*\*[0-9.]+\*\* \(NLL [0-9.]+" $OUT/eval-$name.txt >> $S
		done
	fi
	if [ -n "${GOBENCH:-}" ]; then
		timeout 200 $B/cuda.test -test.run '^$' -test.bench "$GOBENCH" ${GOBENCH_FLAGS:--test.benchtime 300x -test.count 2} > $OUT/gobench.txt 2>&1
		echo "gobench rc=$? ($(($(date +%s) - T0)) s)" >> $S
	fi
	if [ "${REPLICAS:-1}" = 1 ]; then
		CHUNLIAN=$B/chunlian OUT=/tmp/br SERIES=scale DURATION=6s timeout 150 bash deploy/bench-replicas.sh > /tmp/br.md 2>&1
		echo "bench-replicas rc=$? ($(($(date +%s) - T0)) s)" >> $S
		cat /tmp/br.md >> $S
	fi
	if [ -n "${PROFILE:-}" ]; then
		# A server CPU profile under PROFILE closed-loop users (serve
		# flags: SERVER_FLAGS and PROFILE_FLAGS), and the engine's
		# counters after the load.
		$B/chunlian serve --backend cuda --addr 127.0.0.1:8099 --pprof --log-level warn ${SERVER_FLAGS:-} ${PROFILE_FLAGS:-} > $OUT/profile-serve.log 2>&1 &
		SP=$!
		for _ in $(seq 240); do curl -sf 127.0.0.1:8099/ready > /dev/null && break; sleep 0.5; done
		$B/chunlian bench --url http://127.0.0.1:8099 --concurrency "$PROFILE" --duration 14s --warmup 3s --quiet --out $OUT/profile-bench.md > /dev/null 2>&1 &
		BP=$!
		sleep 7
		curl -s "http://127.0.0.1:8099/debug/pprof/profile?seconds=6" > $OUT/server.prof
		if [ -n "${TRACE:-}" ]; then
			curl -s "http://127.0.0.1:8099/debug/pprof/trace?seconds=$TRACE" > /tmp/server.trace
			python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), lzma.open(sys.argv[2], "wb", preset=6))' /tmp/server.trace $OUT/server.trace.xz
			echo "trace: $(stat -c %s /tmp/server.trace) bytes" >> $S
		fi
		wait $BP
		curl -s 127.0.0.1:8099/metrics | grep -E "^chunlian:(engine|kv|kept|num_preempt|prefix|request_success|requests_rejected)|^go_(gc_duration_seconds_count|gc_gomemlimit_bytes|goroutines|memstats_(heap_inuse|next_gc|gc_cpu_fraction|mallocs_total))|^process_resident" > $OUT/profile-metrics.txt
		kill $SP
		wait $SP 2> /dev/null
		[ -s $OUT/profile-serve.log ] || rm -f $OUT/profile-serve.log
		echo "profile at $PROFILE users ($(($(date +%s) - T0)) s): $OUT/server.prof" >> $S
		grep -E "^\| target \|" $OUT/profile-bench.md | tail -1 >> $S
	fi
	# The device tool brings back 8 files: the bench reports travel as one
	# archive (the summary above holds their engine lines).
	(cd $OUT && python3 -c 'import glob, sys, tarfile
fs = sorted(glob.glob("gpu-*.json") + glob.glob("gpu-*.md"))
if fs:
    with tarfile.open("reports.tar.gz", "w:gz") as t:
        for f in fs: t.add(f)
    for f in fs: __import__("os").remove(f)')
	cat $S
	;;
*)
	echo "usage: scripts/gpu.sh build | check" >&2
	exit 2
	;;
esac
