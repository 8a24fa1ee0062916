#!/usr/bin/env bash
# N chunlian replicas on one host behind nginx, without containers: one per
# GPU (BACKEND=cuda: replica i runs --device i) or N CPU replicas on split
# cores. nginx uses the shipped deploy/compose/nginx.conf with one upstream
# line per replica. Ctrl-C (or SIGTERM) stops nginx, then drains the replicas.
#
#   deploy/run-replicas.sh 4                          # 4 CPU replicas, cores split evenly
#   BACKEND=cuda deploy/run-replicas.sh 8             # one replica per GPU on an 8-GPU host
#   curl -s 127.0.0.1:8080/generate -d '{"prompt":"平安"}'
#
# Env: CHUNLIAN (binary, default ./chunlian, else on PATH), LISTEN (8080),
# BASE_PORT (8100: replica i on BASE_PORT+i), CORES_PER_REPLICA (default
# nproc/N), DIR (config and logs; default a temp dir), EXTRA (more `serve`
# flags), NGINX (the nginx binary, default nginx on PATH; Debian: apt-get
# install nginx). Without nginx the replicas still start and their
# addresses are printed.
set -euo pipefail
n=${1:?usage: run-replicas.sh N}
here=$(cd "$(dirname "$0")" && pwd)
CHUNLIAN=${CHUNLIAN:-./chunlian}
[ -x "$CHUNLIAN" ] || CHUNLIAN=$(command -v chunlian) || { echo "run-replicas: no chunlian binary (set CHUNLIAN=)" >&2; exit 2; }
BACKEND=${BACKEND:-cpu}
LISTEN=${LISTEN:-8080}
BASE_PORT=${BASE_PORT:-8100}
ncpu=$(nproc)
CORES_PER_REPLICA=${CORES_PER_REPLICA:-$(( ncpu / n > 0 ? ncpu / n : 1 ))}
DIR=${DIR:-$(mktemp -d)}
mkdir -p "$DIR"

pids=() nginx_pid=
stop() {
  [ -n "$nginx_pid" ] && kill -QUIT "$nginx_pid" 2>/dev/null
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 0' INT TERM

upstreams=""
for i in $(seq 0 $(( n - 1 ))); do
  port=$(( BASE_PORT + i ))
  first=$(( (i * CORES_PER_REPLICA) % ncpu )) last=$(( (i * CORES_PER_REPLICA) % ncpu + CORES_PER_REPLICA - 1 ))
  dev=()
  [ "$BACKEND" = cuda ] && dev=(--device "$i")
  # shellcheck disable=SC2086 # EXTRA is a list of flags
  taskset -c "$first-$last" "$CHUNLIAN" serve --backend "$BACKEND" "${dev[@]}" --addr "127.0.0.1:$port" \
    --threads "$CORES_PER_REPLICA" --log-format json ${EXTRA:-} > "$DIR/replica$i.log" 2>&1 &
  pids+=($!)
  upstreams+="server 127.0.0.1:$port max_fails=1 fail_timeout=2s;\n        "
  echo "run-replicas: replica $i on 127.0.0.1:$port (cores $first-$last${dev:+, GPU $i}), log $DIR/replica$i.log"
done

for i in $(seq 0 $(( n - 1 ))); do
  until python3 -c 'import sys, urllib.request
try: sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception: sys.exit(1)' "http://127.0.0.1:$(( BASE_PORT + i ))/ready"; do
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "run-replicas: replica $i exited:" >&2; tail -5 "$DIR/replica$i.log" >&2; exit 1; }
    sleep 0.2
  done
done
echo "run-replicas: $n replicas ready"

NGINX=${NGINX:-nginx}
if ! command -v "$NGINX" >/dev/null; then
  echo "run-replicas: nginx not installed: use the replicas directly; Ctrl-C stops them"
  wait
  exit 0
fi
user=""
[ "$(id -u)" = 0 ] && user="user root;"
sed -e "s|server chunlian:8000 max_fails=1 fail_timeout=2s;|$upstreams|" \
    -e "s|listen 80;|listen 127.0.0.1:$LISTEN;|" \
    -e "s|pid /tmp/nginx.pid;|$user pid $DIR/nginx.pid;|" \
    -e "s|/tmp/nginx-|$DIR/nginx-|g" \
    -e "s|access_log /dev/stdout upstreams;|access_log $DIR/access.log upstreams;|" \
    "$here/compose/nginx.conf" > "$DIR/nginx.conf"
"$NGINX" -t -q -c "$DIR/nginx.conf" -p "$DIR"
"$NGINX" -c "$DIR/nginx.conf" -p "$DIR" -g 'daemon off;' &
nginx_pid=$!
echo "run-replicas: nginx on http://127.0.0.1:$LISTEN/ (access log $DIR/access.log); Ctrl-C stops everything"
wait "$nginx_pid"
