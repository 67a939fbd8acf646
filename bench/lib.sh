# Sourced by bench/sets/run.sh and bench/snapshots/run.sh: bench_run DIR [--out=RESULTS] [bench.py options]
# runs DIR/bench.py as root with gsnap installed, its output also in RESULTS/run.log (default
# DIR/results; a partial run, --only, appends to it, as bench.py merges its figures into the
# last summary.json), then DIR/plot.py on RESULTS.
bench_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$bench_root/scripts/lib.sh"
. "$bench_root/scripts/pyenv.sh"

bench_run() {
    local here="$1" out="$1/results" a
    shift
    is_root || die "run as root (the benchmark clusters run as the unprivileged user $GSNAP_OS_USER)"
    [ -f "$("$PG_CONFIG" --pkglibdir)/gsnap.so" ] || die "gsnap is not installed; run: bash scripts/install.sh"
    local args=() tee_args=()
    for a in "$@"; do
        case "$a" in
            --out=*) out="${a#--out=}" ;;
            --only|--only=*) tee_args=(-a); args+=("$a") ;;
            *) args+=("$a") ;;
        esac
    done
    mkdir -p "$out"
    python "$here/bench.py" --out "$out" "${args[@]}" 2>&1 | tee "${tee_args[@]}" "$out/run.log"
    python "$here/plot.py" "$out"
}
