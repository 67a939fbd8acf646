#!/usr/bin/env bash
# Runs every gsnap test: installs what is missing, builds and installs the extension, then
#   0. the lints, each one test: `cargo fmt --check` and `cargo clippy -D warnings`;
#   1. the pure Rust crates' unit and property tests (cargo test, no PostgreSQL);
#   2. the pg_regress suite on a fresh temporary cluster (scripts/regress.sh);
#   3. the integration tests against real clusters (tests/, pytest).
# Ends with one line "summary: N passed, M failed" (counted per test) and a non-zero exit
# status if anything failed.
. "$(dirname "$0")/lib.sh"

"$GSNAP_ROOT/scripts/install.sh"
. "$GSNAP_ROOT/scripts/pyenv.sh"

passed=0; failed=0
logdir=$(mktemp -d /tmp/gsnap-test.XXXXXX)

# A rustup component the lints need (rustfmt, clippy), added if rustup can; false if missing.
ensure_component() {
    local subcommand=$1 component=$2
    cargo "$subcommand" --version >/dev/null 2>&1 && return 0
    if command -v rustup >/dev/null; then
        log "installing the Rust component $component"
        rustup component add "$component" >/dev/null 2>&1 || true
    fi
    cargo "$subcommand" --version >/dev/null 2>&1
}

# Lints first: they take seconds once the extension is built, and say what to fix before the
# slow tiers run. Each lint counts as one test.
lp=0; lf=0; lint_fixes=()
log "lint: cargo fmt --all -- --check"
if ! ensure_component fmt rustfmt; then
    echo "lint: rustfmt is missing; install it with: rustup component add rustfmt"
    lf=$((lf + 1))
elif (cd "$GSNAP_ROOT" && cargo fmt --all -- --check -l) >"$logdir/fmt.log" 2>&1; then
    lp=$((lp + 1))
else
    lf=$((lf + 1))
    echo "lint: cargo fmt would change these files:"
    sed "s|^$GSNAP_ROOT/|    |" "$logdir/fmt.log"
    echo "lint: to fix, run: cargo fmt --all"
    lint_fixes+=("formatting: run cargo fmt --all")
fi

# --release and scripts/lib.sh's environment: the profile, flags and target directory of
# every other build here, so clippy reuses the compiled dependencies (RocksDB's C++ is never
# compiled again) and only checks the workspace's own crates.
log "lint: cargo clippy --release --workspace --all-targets -- -D warnings"
if ! ensure_component clippy clippy; then
    echo "lint: clippy is missing; install it with: rustup component add clippy"
    lf=$((lf + 1))
elif (cd "$GSNAP_ROOT" && cargo clippy --release --workspace --all-targets -- -D warnings 2>&1) \
        | tee "$logdir/clippy.log"; then
    lp=$((lp + 1))
else
    lf=$((lf + 1))
    echo "lint: clippy has findings (above, and in $logdir/clippy.log). To fix, change the code"
    echo "lint: as each one says (cargo clippy --fix --release --workspace --all-targets applies"
    echo "lint: the mechanical ones), then check again with the command above."
    lint_fixes+=("clippy: fix the findings in $logdir/clippy.log")
fi
passed=$((passed + lp)); failed=$((failed + lf))

log "cargo test (pure crates)"
if (cd "$GSNAP_ROOT" && cargo test --release --workspace 2>&1) \
        | tee "$logdir/cargo.log"; then :; fi
# Under `set -o pipefail` a grep that finds nothing would end the script, hence `|| true`.
p=$({ grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$logdir/cargo.log" \
        || true; } | awk '{p += $4; f += $6} END {print p+0, f+0}')
read -r cp cf <<<"$p"
grep -q 'test result: FAILED\|error\[E\|could not compile' "$logdir/cargo.log" && cf=$((cf > 0 ? cf : 1))
passed=$((passed + cp)); failed=$((failed + cf))

log "pg_regress"
"$GSNAP_ROOT/scripts/regress.sh" 2>&1 | tee "$logdir/regress.log" || true
rp=$(grep -Ec '\.\.\. ok' "$logdir/regress.log" || true)
rf=$(grep -Ec '\.\.\. FAILED|\.\.\. failed' "$logdir/regress.log" || true)
grep -q 'tests passed' "$logdir/regress.log" || rf=$((rf > 0 ? rf : 1))
passed=$((passed + rp)); failed=$((failed + rf))

log "integration tests (pytest)"
(cd "$GSNAP_ROOT" && python -m pytest -q --durations=15 tests 2>&1) | tee "$logdir/pytest.log" || true
# pytest's last line, e.g. "2 failed, 38 passed, 1 error in 272.14s (0:04:32)".
ps=$({ grep -E '[0-9]+ (passed|failed|errors?).* in [0-9.]+s' "$logdir/pytest.log" || true; } | tail -1)
pp=$({ grep -Eo '[0-9]+ passed' <<<"$ps" || true; } | awk '{s += $1} END {print s+0}')
pf=$({ grep -Eo '[0-9]+ (failed|errors?)' <<<"$ps" || true; } | awk '{s += $1} END {print s+0}')
[ -n "$ps" ] || pf=$((pf > 0 ? pf : 1))
passed=$((passed + pp)); failed=$((failed + pf))

for fix in "${lint_fixes[@]}"; do echo "lint failed, $fix"; done
echo "lint: $lp passed, $lf failed; cargo: $cp passed, $cf failed; pg_regress: $rp passed, $rf failed; pytest: $pp passed, $pf failed"
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
