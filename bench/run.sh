#!/usr/bin/env bash
# Runs every benchmark, one after the other (two at once would measure each other): the
# snapshot index alone (bench/index, pure Rust), then gsnap in PostgreSQL (bench/snapshots,
# bench/sets, bench/lifetimes, bench/flashback). Installs gsnap first if needed (scripts/install.sh). Run as root.
#
#   bench/run.sh            full runs, about 25 minutes on 2 cores; results in bench/*/results/
#   bench/run.sh --quick    smoke runs, about 2-3 minutes; results in /tmp/gsnap-bench-quick/*/
#
# Each directory's README explains its figures; bench/README.md summarizes them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
args=()
if [ "${1:-}" = "--quick" ]; then
    quick=/tmp/gsnap-bench-quick
    rm -rf "$quick"
fi
bash "$here/../scripts/install.sh"
for d in index snapshots sets lifetimes flashback; do
    echo "==> bench/$d"
    if [ -n "${quick:-}" ]; then
        args=(--quick "--out=$quick/$d")
    fi
    bash "$here/$d/run.sh" "${args[@]}"
done
echo "==> done: ${quick:-$here/*/results}"
