#!/usr/bin/env bash
# Runs the index benchmarks (GSnap vs T-index vs O-index; Skippy heights) and plots them.
# Usage: bench/index/run.sh [--quick] [--only memory,lookup,grouplen,skippy] [--out=DIR]
# Results: bench/index/results/*.csv, summary.json, *.png (see bench/index/README.md), or DIR.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/results"
args=()
for a in "$@"; do
    case "$a" in
        --out=*) out="${a#--out=}" ;;
        *) args+=("$a") ;;
    esac
done
mkdir -p "$out"
cd "$root"
cargo run --release -p gsnap-core --example index_bench -- --out "$out" "${args[@]}" | tee "$out/run.log"
python3 "$here/plot.py" "$out"
