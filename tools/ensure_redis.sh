#!/usr/bin/env bash
# Make sure a Redis answers at JEV_REDIS_URL (default redis://127.0.0.1:6379/0); start or install one if not.
set -euo pipefail
url="${JEV_REDIS_URL:-redis://127.0.0.1:6379/0}"
hostport="${url#redis://}"; hostport="${hostport%%/*}"
host="${hostport%%:*}"; port="${hostport##*:}"
ping() { (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && timeout 2 head -c 5 <&3 | grep -q PONG) 2>/dev/null; }
if ping; then echo "redis: reachable at $host:$port"; exit 0; fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis: not installed; installing redis-server from Debian packages"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
fi
mkdir -p /tmp/jev-redis
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --dir /tmp/jev-redis --logfile /tmp/jev-redis/redis.log
for _ in $(seq 50); do ping && { echo "redis: started at $host:$port"; exit 0; }; sleep 0.1; done
echo "redis: could not start at $host:$port" >&2; exit 1
