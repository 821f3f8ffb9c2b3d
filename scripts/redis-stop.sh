#!/usr/bin/env bash
# Usage: scripts/redis-stop.sh DIR
#
# Stops the redis-servers whose pid files are DIR/redis-*.pid (those the
# README's recipes start) and waits, at most 20 s, until they have exited,
# so that DIR can go. It stops nothing else: a server that did not start
# wrote no pid file, and a pid that is no redis-server's is passed over.
# (Not `redis-cli -p PORT shutdown`: when the recipe's server did not
# start, what answers on the port is another server.)
set -u
if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
# alive: the process runs (a zombie, not yet reaped, has exited).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  case "$(ps -p "$1" -o stat= 2>/dev/null)" in *Z*) return 1 ;; esac
}
pids=()
for f in "$1"/redis-*.pid; do
  pid=$(cat "$f" 2>/dev/null) || continue
  case "$(ps -p "$pid" -o comm= 2>/dev/null)" in
    *redis*) kill -TERM "$pid" 2>/dev/null && pids+=("$pid") ;;
  esac
done
SECONDS=0
while [ ${#pids[@]} -gt 0 ]; do
  left=()
  for pid in "${pids[@]}"; do
    if alive "$pid"; then left+=("$pid"); fi
  done
  [ ${#left[@]} -eq 0 ] && exit 0
  pids=("${left[@]}")
  if [ "$SECONDS" -ge 20 ]; then
    echo "redis-stop: still running after 20 s: ${pids[*]}" >&2
    exit 1
  fi
  sleep 0.1
done
