#!/usr/bin/env bash
# Runs the flashback benchmarks (gsnap_restore) and plots them.
# Usage: bench/flashback/run.sh [--quick] [--only restore] [--out=DIR] [bench.py options]
# Needs root (the benchmark cluster runs as the gsnap OS user, like scripts/cluster.sh) and gsnap
# installed (bash scripts/install.sh). Results: bench/flashback/results/ (see README.md here).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib.sh"
bench_run "$here" "$@"
