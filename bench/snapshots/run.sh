#!/usr/bin/env bash
# Runs the PostgreSQL-level snapshot benchmarks and plots them.
# Usage: bench/snapshots/run.sh [--quick] [--only tps,declare,capture,asof] [--profile] [--out=DIR] [bench.py options]
# Needs root (clusters run as the gsnap OS user, like scripts/cluster.sh) and gsnap installed
# (bash scripts/install.sh). Results: bench/snapshots/results/ (see bench/snapshots/README.md);
# a partial run (--only) adds to the log and the summary of the last full run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib.sh"
bench_run "$here" "$@"
