#!/usr/bin/env bash
# Runs the lifetimes benchmarks (retention, reclamation, deletion) and plots them.
# Usage: bench/lifetimes/run.sh [--quick] [--only steady,reclaim,delete] [--minutes M] [--out=DIR]
# Needs root and gsnap installed (bash scripts/install.sh). Results: bench/lifetimes/results/
# (see bench/lifetimes/README.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib.sh"
bench_run "$here" "$@"
