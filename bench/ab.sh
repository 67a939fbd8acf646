#!/usr/bin/env bash
# A/B comparison of two revisions of gsnap on one PostgreSQL benchmark, interleaved so the
# shared machine's noise hits both alike: builds each revision's extension package once (in
# a git worktree, sharing the build cache), then alternates installing them and running the
# benchmark, ROUNDS times each. Run as root.
#
#   bench/ab.sh OLD_REV NEW_REV ROUNDS OUTDIR -- bench/snapshots/bench.py --quick --only capture,asof
#
# Results: OUTDIR/{old,new}-N/summary.json (compare the medians). The new revision's package
# stays installed at the end.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../scripts/lib.sh"
[ $# -ge 6 ] && [ "$5" = "--" ] || die "usage: bench/ab.sh OLD_REV NEW_REV ROUNDS OUTDIR -- BENCH.py [options]"
old=$1; new=$2; rounds=$3; out=$4; shift 5
mkdir -p "$out"
build() { # rev -> package dir
    local rev=$1 tree="$out/tree-$2" pkg="$out/pkg-$2"
    rm -rf "$tree"; git -C "$GSNAP_ROOT" worktree prune
    git -C "$GSNAP_ROOT" worktree add -q --detach "$tree" "$rev"
    # Worktrees share the target directory; fresh timestamps make cargo rebuild the crates.
    find "$tree/src" "$tree/crates" -name '*.rs' -exec touch {} +
    bash "$tree/scripts/install.sh" >"$out/build-$2.log" 2>&1 || die "building $rev failed: see $out/build-$2.log"
    rm -rf "$pkg"; cp -a "$GSNAP_CACHE/package" "$pkg"
    git -C "$GSNAP_ROOT" worktree remove --force "$tree"
}
install_pkg() {
    (cd "$1" && find . -type f) | while read -r f; do
        dest="/${f#./}"
        cp "$1/$f" "$dest.gsnap-new"; chmod 644 "$dest.gsnap-new"; mv -f "$dest.gsnap-new" "$dest"
    done
}
build "$old" old
build "$new" new
. "$GSNAP_ROOT/scripts/pyenv.sh"
for i in $(seq 1 "$rounds"); do
    for v in old new; do
        install_pkg "$out/pkg-$v"
        log "round $i: $v"
        python "$@" --out="$out/$v-$i" >"$out/$v-$i.log" 2>&1 || echo "run $v-$i failed: see $out/$v-$i.log"
    done
done
