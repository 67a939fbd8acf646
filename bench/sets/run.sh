#!/usr/bin/env bash
# Runs the PostgreSQL-level benchmarks of snapshot sets (gsnap_range, gsnap_diff) and plots them.
# Usage: bench/sets/run.sh [--quick] [--only range,diff] [--no-profile] [--out=DIR] [bench.py options]
# Needs root (the benchmark clusters run as the gsnap OS user, like scripts/cluster.sh) and gsnap
# installed (bash scripts/install.sh). Results: bench/sets/results/ (see bench/sets/README.md);
# a partial run (--only) adds to the log and the summary of the last full run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib.sh"
bench_run "$here" "$@"
