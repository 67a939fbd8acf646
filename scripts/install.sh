#!/usr/bin/env bash
# Installs what gsnap needs on Debian 12 (PostgreSQL 15 and its headers, clang for bindgen,
# cargo-pgrx), builds the extension and installs it into PostgreSQL. Safe to run again: each
# step is skipped when already done, and build outputs are cached under $GSNAP_CACHE.
. "$(dirname "$0")/lib.sh"

is_root || die "run as root: it installs Debian packages and the extension"
ensure_dev_null

# sqlsmith: the random-query fuzzer run by tests/test_fuzz.py
packages=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-contrib
          clang libclang-dev build-essential pkg-config ca-certificates python3 python3-pip
          sqlsmith)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
ensure_dev_null

command -v cargo >/dev/null || die "Rust is required (cargo not found); install it with rustup (1.88 or newer)"

mkdir -p "$GSNAP_CACHE/tools"
if [ "$(cargo-pgrx pgrx --version 2>/dev/null || true)" != "cargo-pgrx $PGRX_VERSION" ]; then
    log "installing cargo-pgrx $PGRX_VERSION (about 4 minutes, once)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --root "$GSNAP_CACHE/tools"
fi
if ! grep -qs "pg$PG_MAJOR = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml"; then
    log "configuring pgrx for PostgreSQL $PG_MAJOR"
    mkdir -p "$PGRX_HOME"
    cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" >/dev/null
fi

log "building the gsnap extension (the first build compiles RocksDB: ~10 minutes)"
start=$(date +%s)
package="$GSNAP_CACHE/package"
rm -rf "$package"
(cd "$GSNAP_ROOT" && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$package")
# Install each file by renaming a complete copy into place, so servers running the old
# library keep their mapped file intact (an in-place overwrite can crash them).
(cd "$package" && find . -type f) | while read -r f; do
    dest="/${f#./}"
    mkdir -p "$(dirname "$dest")"
    cp "$package/$f" "$dest.gsnap-new"
    chmod 644 "$dest.gsnap-new"
    mv -f "$dest.gsnap-new" "$dest"
done
log "extension built and installed in $(( $(date +%s) - start )) s"
ensure_dev_null
ensure_os_user
