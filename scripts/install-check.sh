#!/usr/bin/env bash
# Installs the package scripts/package.sh built on this machine and starts the daemon from the
# installed config: `systemctl start tollgate` where systemd runs, else the documented foreground
# command as the `tollgate` user. Then `redis-cli -s /run/tollgate/resp.sock ping` and
# `tollgate status`, and stops it. Needs root; changes the machine (not run in CI).
set -euo pipefail
deb=${1:-$(ls -t target/debian/tollgate_*.deb | head -n 1)}
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "./$deb" >/dev/null
dpkg -L tollgate | grep -E 'bin/tollgate|tollgate.yaml|\.service|\.socket' >&2

if [ -d /run/systemd/system ]; then
  systemctl start tollgate
  stop() { systemctl stop tollgate tollgate.socket tollgate-http.socket; }
else
  echo "install-check: no systemd here; running the foreground command" >&2
  install -d -o tollgate -g tollgate -m 0750 /run/tollgate
  runuser -u tollgate -- tollgate serve --config /etc/tollgate/tollgate.yaml >/tmp/tollgate-install-check.log 2>&1 &
  pid=$!
  # runuser reports the TERM it passed on as its own status.
  stop() { kill -TERM "$pid"; wait "$pid" || true; }
fi
for _ in $(seq 600); do
  [ -S /run/tollgate/resp.sock ] && redis-cli -s /run/tollgate/resp.sock ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -s /run/tollgate/resp.sock ping
tollgate status --socket /run/tollgate/http.sock || true
stop
echo "install-check: ok"
