#!/usr/bin/env bash
# Runs the healthchecks of running containers, as Docker's engine does by itself. Podman runs them from
# systemd timers; without systemd (these build machines) no healthcheck ever runs and compose waits
# forever for `condition: service_healthy`. Every INTERVAL seconds, `podman healthcheck run` for each
# running container that has one (status shows "(starting)", "(healthy)" or "(unhealthy)"), in
# parallel, each bounded by a timeout. Started and stopped by tools/container_ci.sh.
set -u
interval="${1:-2}"
while true; do
  podman ps --format '{{.ID}} {{.Status}}' 2>/dev/null | while read -r id status; do
    case "$status" in
      *"(starting)"*|*"(healthy)"*|*"(unhealthy)"*) timeout 30 podman healthcheck run "$id" >/dev/null 2>&1 & ;;
    esac
  done
  wait
  sleep "$interval"
done
