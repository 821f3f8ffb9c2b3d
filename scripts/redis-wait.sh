#!/usr/bin/env bash
# Usage: scripts/redis-wait.sh DIR PORT... [-- TEXT REDIS-CLI-ARGS...]
#
# Waits until each redis-server started with --daemonize yes and
# --pidfile DIR/redis-PORT.pid --logfile DIR/redis-PORT.log answers on
# 127.0.0.1:PORT, and, after --, until `redis-cli -p PORT REDIS-CLI-ARGS...`
# answers with TEXT in it (cluster_state:ok to `cluster info`). At most 20 s
# in all, then exit 1 saying why, with the end of the server's log. The
# README's Redis recipes call it after starting their servers.
#
# A daemonized redis-server returns 0 before it listens, also when it never
# will (the port taken: it writes no pid file, logs why and exits), and what
# answers on the port may be another server: the one that counts is the one
# whose process_id is its pid file's.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR PORT... [-- TEXT REDIS-CLI-ARGS...]" >&2
  exit 2
fi
dir=$1
shift
ports=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do ports+=("$1"); shift; done
text=""
if [ $# -gt 0 ]; then shift; text=${1-}; [ $# -gt 0 ] && shift; fi
SECONDS=0

# alive: the process runs (a zombie, not yet reaped, has exited).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  case "$(ps -p "$1" -o stat= 2>/dev/null)" in *Z*) return 1 ;; esac
}

for port in "${ports[@]}"; do
  pidfile=$dir/redis-$port.pid log=$dir/redis-$port.log
  fail() {
    echo "redis-wait: port $port: $1 (see $log)" >&2
    [ -f "$log" ] && tail -n 3 "$log" >&2
    exit 1
  }
  while :; do
    # The server started: its pid file's pid, or before it writes one the
    # pid its log names.
    pid=$(cat "$pidfile" 2>/dev/null || sed -n 's/.* pid=\([0-9][0-9]*\),.*just started.*/\1/p' "$log" 2>/dev/null | tail -n 1)
    if [ -n "$pid" ] && ! alive "$pid"; then
      fail "the redis-server started (pid $pid) exited"
    fi
    answering=$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
    if [ -n "$pid" ] && [ "$answering" = "$pid" ]; then
      if [ -z "$text" ] || redis-cli -p "$port" "$@" 2>/dev/null | grep -qF -- "$text"; then
        break
      fi
      why="redis-cli -p $port $* did not answer with $text"
    elif [ -n "$answering" ]; then
      why="another Redis (pid $answering) answers there, not the redis-server of $pidfile"
    elif [ -z "$pid" ]; then
      why="no redis-server started (no $pidfile)"
    else
      why="the redis-server started (pid $pid) does not answer"
    fi
    [ "$SECONDS" -lt 20 ] || fail "$why after 20 s"
    sleep 0.1
  done
done
