#!/usr/bin/env bash
# promtool, Prometheus's rule checker, for the rule and dashboard tests (tests/unit/test_prometheus_rules.py,
# test_grafana_dashboard.py): taken from Debian's `prometheus` package without installing it (`apt-get download`
# + `dpkg -x`: no daemon, no service user), into .cache/promtool/promtool. Debian bookworm ships 2.42.
#
#   bash tools/promtool.sh     # prints where promtool is; exit 1 (and why) when it cannot be had here
#
# A promtool already on PATH is used as it is. make test runs this first; where it fails the tests skip, naming
# the reason.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.cache/promtool"

if command -v promtool >/dev/null 2>&1; then
  echo "promtool: $(command -v promtool)"
  exit 0
fi
if [[ -x "$dest/promtool" ]]; then
  echo "promtool: $dest/promtool"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
  echo "promtool: not installed (no apt-get/dpkg here to take it from Debian's prometheus package)" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/jev-promtool.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download -qq prometheus >/dev/null 2>&1; then
  # the package lists may be missing or stale; refreshing them needs root
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq >/dev/null 2>&1 || true
  fi
  if ! apt-get download -qq prometheus >/dev/null 2>&1; then
    echo "promtool: not installed (apt-get download prometheus failed: no package list or no network)" >&2
    exit 1
  fi
fi
dpkg -x prometheus_*.deb unpacked
mkdir -p "$dest"
install -m 0755 unpacked/usr/bin/promtool "$dest/promtool"
echo "promtool: $dest/promtool ($("$dest/promtool" --version 2>&1 | head -1))"
