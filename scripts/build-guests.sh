#!/usr/bin/env bash
# Builds every guest module under policies/modules for wasm32-unknown-unknown and turns each core
# module into a component (tools/componentize, wit-component in-process). Output:
#   policies/modules/target/components/<name>.wasm   (never committed)
# Uses rustup's wasm32 target when it is installed, Debian's rustc-web otherwise (see docs/design.md,
# "Building WASM guests"), and says what to install when neither is there.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
modules="$root/policies/modules"
out="$modules/target/components"
# guest crate -> component name
guests=(catalog:catalog yaml_guard:yaml-guard key_prefix:key-prefix json_catalog:json-catalog hostile:hostile)

# An outer cargo (build.rs, `cargo test`) exports variables that would point this build at its own
# toolchain, target directory and flags. Keep only CARGO_HOME (where the registry lives).
while IFS='=' read -r name _; do
    case "$name" in
        CARGO_HOME) ;;
        CARGO_* | RUSTUP_TOOLCHAIN | RUSTC | RUSTC_* | RUSTDOC | RUSTFLAGS | RUSTDOCFLAGS | __CARGO_*) unset "$name" ;;
    esac
done < <(env)

log() { echo "build-guests: $*" >&2; }

if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    log "using rustup's wasm32-unknown-unknown target"
    (cd "$modules" && cargo build --release --locked --target wasm32-unknown-unknown)
elif [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust/library ] \
    && command -v wasm-ld >/dev/null; then
    log "using Debian's rustc-web with -Zbuild-std"
    (cd "$modules" && RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
        CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld \
        /usr/bin/cargo build --release --locked --target wasm32-unknown-unknown \
        -Zbuild-std=std,panic_abort)
else
    cat >&2 <<'MSG'
build-guests: no toolchain can build wasm32-unknown-unknown guests. Install either
  rustup target add wasm32-unknown-unknown
or (where rustup cannot download targets) Debian's web toolchain:
  apt-get install rustc-web cargo-web rust-web-src lld
MSG
    exit 1
fi

# The componentizer is a host tool of the main workspace; its own target directory keeps this
# build from waiting on the lock of an outer cargo that is running us (crates/policy/build.rs).
log "componentizing"
mkdir -p "$out"
pairs=()
for guest in "${guests[@]}"; do
    pairs+=("$modules/target/wasm32-unknown-unknown/release/${guest%%:*}.wasm" "$out/${guest##*:}.wasm")
done
CARGO_TARGET_DIR="$modules/target/host" cargo run --quiet --release \
    --manifest-path "$root/tools/componentize/Cargo.toml" -- "${pairs[@]}"
log "components in ${out#"$root"/}: $(cd "$out" && echo *.wasm)"
