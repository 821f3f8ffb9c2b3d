#!/usr/bin/env bash
# Makes sure the programs the tests start are installed: redis-server and
# redis-cli (Redis store and Redis Cluster tests), nginx (auth_request
# end-to-end test), chromium (the operator page's browser test), and curl, ip (iproute2) and unshare (util-linux) for the
# README's blocks that `make docs-check` runs, and prometheus and promtool
# (the alert rules' unit tests and the deploy/ test that runs Prometheus
# against rls). On Debian/Ubuntu as root it installs what is missing, with
# no recommended packages (Debian's prometheus recommends node-exporter and
# more; about 15 s for prometheus here); otherwise it says exactly what to
# install and fails.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
missing=()
have redis-server || missing+=(redis-server)
have redis-cli || missing+=(redis-tools)
have nginx || missing+=(nginx)
have chromium || have chromium-browser || missing+=(chromium)
have curl || missing+=(curl)
have ip || missing+=(iproute2)
have unshare || missing+=(util-linux)
have prometheus || missing+=(prometheus)
have promtool || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

# redis-server pulls redis-tools; ask for the server package names only.
pkgs=()
for p in "${missing[@]}"; do
  case "$p" in redis-tools) pkgs+=(redis-server) ;; *) pkgs+=("$p") ;; esac
done
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "prereqs: installing ${pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  # The packages may start system services; the tests start their own.
  for svc in redis-server nginx prometheus; do
    if command -v service >/dev/null 2>&1; then service "$svc" stop >/dev/null 2>&1 || true; fi
  done
  exit 0
fi

cat >&2 <<MSG
prereqs: missing ${pkgs[*]}.
The tests start real Redis, nginx, chromium and Prometheus processes on 127.0.0.1.
Install them:
  Debian/Ubuntu:  sudo apt-get install -y --no-install-recommends ${pkgs[*]}
  (make docs-check runs the README's blocks in Linux namespaces: Linux only;
  prometheus and promtool 2.42 or newer, elsewhere from prometheus.io/download)
then run make test again.
MSG
exit 1
