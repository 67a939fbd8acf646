#!/usr/bin/env bash
# Runs every gsnap test: installs what is missing, builds and installs the extension, then
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
(cd "$GSNAP_ROOT" && python -m pytest -q tests 2>&1) | tee "$logdir/pytest.log" || true
# pytest's last line, e.g. "2 failed, 38 passed, 1 error in 272.14s (0:04:32)".
ps=$({ grep -E '[0-9]+ (passed|failed|errors?).* in [0-9.]+s' "$logdir/pytest.log" || true; } | tail -1)
pp=$({ grep -Eo '[0-9]+ passed' <<<"$ps" || true; } | awk '{s += $1} END {print s+0}')
pf=$({ grep -Eo '[0-9]+ (failed|errors?)' <<<"$ps" || true; } | awk '{s += $1} END {print s+0}')
[ -n "$ps" ] || pf=$((pf > 0 ? pf : 1))
passed=$((passed + pp)); failed=$((failed + pf))

echo "cargo: $cp passed, $cf failed; pg_regress: $rp passed, $rf failed; pytest: $pp passed, $pf failed"
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
