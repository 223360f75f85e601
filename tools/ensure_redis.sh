#!/usr/bin/env bash
# A Redis at JEV_REDIS_URL (default redis://127.0.0.1:6379/0) for one command, or installed.
#
#   bash tools/ensure_redis.sh -- CMD ARGS...   run CMD with a Redis answering; a Redis this script
#                                               started for it (in a per-run folder) is stopped and
#                                               its folder removed when CMD ends; CMD's exit status
#   bash tools/ensure_redis.sh --install        install redis-server from Debian packages if missing
#   bash tools/ensure_redis.sh                  start one if none answers and leave it running
#                                               (prints its folder and how to stop it)
set -euo pipefail
url="${JEV_REDIS_URL:-redis://127.0.0.1:6379/0}"
hostport="${url#redis://}"; hostport="${hostport%%/*}"; hostport="${hostport##*@}"
host="${hostport%%:*}"; port="${hostport##*:}"
[[ "$port" == "$hostport" ]] && port=6379

ping() { (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && timeout 2 head -c 5 <&3 | grep -q PONG) 2>/dev/null; }

install() {
  command -v redis-server >/dev/null 2>&1 && return 0
  echo "redis: not installed; installing redis-server from Debian packages"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
}

if [[ "${1:-}" == "--install" ]]; then install; exit 0; fi
if [[ "${1:-}" == "--" ]]; then shift; fi

if ping; then
  echo "redis: reachable at $host:$port"
  if (($#)); then exec "$@"; fi
  exit 0
fi
install
dir="$(mktemp -d "${TMPDIR:-/tmp}/jev-redis.XXXXXX")"   # per run, never shared
if (($# == 0)); then
  redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
    --dir "$dir" --logfile "$dir/redis.log"
else
  redis-server --bind "$host" --port "$port" --save "" --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" &
  redis_pid=$!
  stop_redis() {
    kill "$redis_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$redis_pid" 2>/dev/null || true
    rm -rf "$dir"
  }
  trap stop_redis EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
fi
for _ in $(seq 50); do
  if ping; then
    if (($# == 0)); then
      echo "redis: started at $host:$port in $dir (stop it: redis-cli -h $host -p $port shutdown)"
      exit 0
    fi
    echo "redis: started at $host:$port for this command, in $dir"
    status=0
    "$@" || status=$?
    exit "$status"
  fi
  sleep 0.1
done
echo "redis: could not start at $host:$port; log: $dir/redis.log" >&2
exit 1
