#!/usr/bin/env bash
# Installs what Tollgate needs on a Debian machine and is missing: redis-server and its tools (the
# embedded default and every integration test), redis-sentinel (Sentinel tests), nutcracker (the
# benchmark's peer proxy), curl, util-linux and passwd (the two-user tests run clients under
# `setpriv`/`prlimit` and create users with `useradd`), and the WASM guest toolchain from Debian
# (only where rustup has no wasm32 target; see docs/design.md, "Building WASM guests"). Safe to run
# again: it installs nothing twice. `systemd` brings systemd-socket-activate and systemd-analyze
# (the systemd integration tests run the daemon under the one and check the units with the other).
set -euo pipefail

packages=(redis-server redis-tools redis-sentinel nutcracker curl util-linux passwd systemd)
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  packages+=(rustc-web cargo-web rust-web-src lld)
fi

need=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || need+=("$package")
done
[ ${#need[@]} -eq 0 ] && exit 0

echo "setup: installing ${need[*]}" >&2
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >/dev/null
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
