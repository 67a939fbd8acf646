#!/usr/bin/env python3
"""Plots the results of bench/sets/bench.py.

Usage: plot.py RESULTS_DIR. Writes next to the CSV files:
  range.png   per update pattern: time of gsnap_range over N snapshots vs N AS OF scans
              producing the same rows, the distinct-image bound and the 0.25 target (top),
              and the ratio range / N AS OF per N against the bound ratio (bottom);
  diff.png    gsnap_diff time vs pages changed between two adjacent snapshots (log-log), with
              one full AS OF scan and 0.1 of it (the target) as horizontal lines;
  parallel.png  per query over 10 snapshots, the serial plan's time and the parallel plan's
              (2 workers), each round as a point and the median as a bar;
  keys.png    a lookup by primary key AS OF snapshots from the first to the last, against the
              same lookup live through the index (client-side ms, medians with rounds as
              points);
  key_ranges.png  a range of N keys AS OF the last snapshot through the key map, by a full read
              of the snapshot, and live through the primary key (log-log, medians).
Each plot is skipped when its CSV is missing. Installs matplotlib with pip if it is missing.
"""
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plotting import main, plt, rows, save  # noqa: E402

STYLE = {
    "range_agg": ("gsnap_range: per-snapshot count(*), sum(v)", "tab:red", "o-"),
    "asof_agg": ("N x gsnap_asof: count(*), sum(v)", "tab:blue", "o-"),
    "range_count": ("gsnap_range: count(*)", "tab:orange", "s--"),
    "asof_count": ("N x gsnap_asof: count(*)", "tab:cyan", "s--"),
    "asof_fscan_count": ("N x gsnap_asof as a function scan (materialized): count(*)", "tab:grey", "^:"),
    "range_row": ("gsnap_range: one row's history", "tab:purple", "d-"),
    "asof_row": ("N x gsnap_asof: one row", "tab:green", "d--"),
}
PATTERN_TITLES = {"random": "0.5% of the rows updated per snapshot, at random",
                  "clustered": "0.5% of the rows updated per snapshot, one run of ids"}


def summary(out):
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def plot_range(out):
    data = rows(out, "range.csv")
    if not data:
        return
    res = summary(out).get("range", {}).get("per_n", {})
    patterns = []
    for r in data:
        if r["pattern"] not in patterns:
            patterns.append(r["pattern"])
    times = defaultdict(list)
    for r in data:
        times[(r["pattern"], int(r["n"]), r["method"])].append(float(r["ms"]))
    fig, axes = plt.subplots(2, len(patterns), figsize=(6.5 * len(patterns), 9), squeeze=False)
    for col, pat in enumerate(patterns):
        ns = sorted({int(r["n"]) for r in data if r["pattern"] == pat})
        ax = axes[0][col]
        for method, (label, color, fmt) in STYLE.items():
            pts = [(n, statistics.median(times[(pat, n, method)]) / 1000) for n in ns if times.get((pat, n, method))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], fmt, color=color, label=label, ms=4)
        asof = [statistics.median(times[(pat, n, "asof_agg")]) / 1000 for n in ns]
        bound = [res.get(f"{pat}/{n}", {}).get("bound_ratio") for n in ns]
        if all(b is not None for b in bound):
            ax.plot(ns, [a * b for a, b in zip(asof, bound)], "k-", lw=1.2,
                    label="distinct-image bound (bound ratio x N AS OF)")
        ax.plot(ns, [0.25 * a for a in asof], "g:", lw=1.2, label="target: 0.25 x N AS OF")
        ax.set(xlabel="N (snapshots in the range)", ylabel="seconds (median of rounds, warm)",
               title=PATTERN_TITLES.get(pat, pat))
        ax.set_xticks(ns)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
        ax = axes[1][col]
        for key, label, color in (("ratio_agg_median", "range / N AS OF: count(*), sum(v)", "tab:red"),
                                  ("ratio_count_median", "range / N AS OF: count(*)", "tab:orange"),
                                  ("ratio_row_median", "range / N AS OF: one row's history", "tab:purple")):
            vals = [res.get(f"{pat}/{n}", {}).get(key) for n in ns]
            if all(v is not None for v in vals):
                ax.plot(ns, vals, "o-", color=color, label=label)
                for n, v in zip(ns, vals):
                    ax.annotate(f"{v:.2f}", (n, v), textcoords="offset points", xytext=(0, 5), fontsize=7,
                                ha="center", color=color)
        if all(b is not None for b in bound):
            ax.plot(ns, bound, "k-", label="bound ratio: distinct images / pages N AS OF read")
        ax.axhline(0.25, color="green", ls=":", label="target 0.25")
        ax.axhline(1.0, color="grey", lw=0.6)
        ax.set(xlabel="N (snapshots in the range)", ylabel="ratio (median of per-round ratios)",
               title="range / N separate AS OF scans, same rows")
        ax.set_xticks(ns)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    save(fig, out, "range.png")


def plot_parallel(out):
    data = rows(out, "parallel.csv")
    if not data:
        return
    queries = []
    for r in data:
        if r["query"] not in queries:
            queries.append(r["query"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    for j, (mode, color) in enumerate((("serial", "tab:blue"), ("parallel", "tab:red"))):
        for i, q in enumerate(queries):
            ms = [float(r["ms"]) / 1000 for r in data if (r["query"], r["mode"]) == (q, mode)]
            x = i + (j - 0.5) * width
            ax.bar(x, statistics.median(ms), width, color=color, alpha=0.6,
                   label=(f"{mode} plan" + (" (2 workers)" if mode == "parallel" else "")) if i == 0 else None)
            ax.plot([x] * len(ms), ms, "k.", markersize=4)
    ax.set_xticks(range(len(queries)), queries)
    ax.set_ylabel("seconds (bars: median; dots: rounds)")
    ax.set_title("gsnap_range / gsnap_versions over 10 snapshots of 2M rows: serial vs parallel")
    ax.legend()
    save(fig, out, "parallel.png")


def plot_keys(out):
    data = rows(out, "keys_lookup.csv")
    if not data:
        return
    snaps = sorted({int(r["snap"]) for r in data})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for j, (col, label, color) in enumerate((("live_ms", "live, through the primary key", "tab:blue"),
                                             ("asof_ms", "AS OF the snapshot, through the key map", "tab:red"))):
        for i, s in enumerate(snaps):
            ms = [float(r[col]) for r in data if int(r["snap"]) == s]
            x = i + (j - 0.5) * width
            ax.bar(x, statistics.median(ms), width, color=color, alpha=0.6, label=label if i == 0 else None)
            ax.plot([x] * len(ms), ms, "k.", markersize=3)
    ax.set_xticks(range(len(snaps)), [f"snapshot {s}" for s in snaps])
    ax.set_ylabel("ms per lookup (client side)")
    ax.set_title("one row by primary key: AS OF vs live")
    ax.legend()
    save(fig, out, "keys.png")


def plot_key_ranges(out):
    data = rows(out, "keys_ranges.csv")
    if not data:
        return
    widths = sorted({int(r["width"]) for r in data})
    fig, ax = plt.subplots(figsize=(7, 4))
    for col, label, style in (("map_ms", "AS OF, through the key map", "o-"),
                              ("full_ms", "AS OF, full read of the snapshot", "s--"),
                              ("live_ms", "live, through the primary key", "^:")):
        ax.plot(widths, [statistics.median(float(r[col]) for r in data if int(r["width"]) == w) for w in widths],
                style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys in the range (id BETWEEN lo AND lo + N - 1)")
    ax.set_ylabel("ms (client side, median)")
    ax.set_title("a range of keys AS OF a snapshot")
    ax.legend()
    save(fig, out, "key_ranges.png")


def plot_diff(out):
    data = rows(out, "diff.csv")
    if not data:
        return
    res = summary(out).get("diff", {})
    cases = defaultdict(list)
    pages = {}
    asof = []
    for r in data:
        if r["kind"] == "diff":
            cases[r["case"]].append(float(r["ms"]))
            pages[r["case"]] = int(r["changed_pages"])
        else:
            asof.append(float(r["ms"]))
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    order = sorted(cases, key=lambda c: pages[c])
    for c in order:
        xs = [pages[c]] * len(cases[c])
        ax.plot(xs, cases[c], ".", color="tab:red", alpha=0.35, ms=4)
    special = ("0.5% rows", "0.5% rows, no deltas")
    pts = [(pages[c], statistics.median(cases[c])) for c in order if c not in special]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:red",
            label="gsnap_diff, one row updated per changed page (median; read from deltas)")
    if "0.5% rows" in cases:
        x, y = pages["0.5% rows"], statistics.median(cases["0.5% rows"])
        ax.plot([x], [y], "*", color="tab:purple", ms=14, label="gsnap_diff, 0.5% of the rows at random (target case)")
        ax.annotate(f"{y:.0f} ms, {res.get('cases', {}).get('0.5% rows', {}).get('ratio_median', float('nan')):.2f} x AS OF",
                    (x, y), textcoords="offset points", xytext=(-10, 12), fontsize=8, ha="right", color="tab:purple")
    if "0.5% rows, no deltas" in cases:
        c = "0.5% rows, no deltas"
        x, y = pages[c], statistics.median(cases[c])
        ax.plot([x], [y], "X", color="tab:grey", ms=11,
                label="the same, captured without deltas (gsnap.page_deltas = off): both images read")
        ax.annotate(f"{y:.0f} ms, {res.get('cases', {}).get(c, {}).get('ratio_median', float('nan')):.2f} x AS OF",
                    (x, y), textcoords="offset points", xytext=(10, 6), fontsize=8, ha="left", color="tab:grey")
    a = statistics.median(asof)
    ax.axhline(a, color="tab:blue", label=f"one full AS OF scan, count(*) (median {a:.0f} ms)")
    ax.axhline(0.1 * a, color="green", ls=":", label="target: 0.1 x AS OF scan")
    total = res.get("pages")
    if total:
        ax.axvline(total, color="grey", lw=0.6, ls="--", label=f"table size ({total} pages)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    slope = res.get("loglog_slope")
    ax.set(xlabel="pages changed between the two snapshots", ylabel="ms (warm)",
           title=f"gsnap_diff of adjacent snapshots, {res.get('rows', 0):,} rows"
                 + (f" (log-log slope {slope:.2f})" if slope is not None else ""))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, out, "diff.png")


if __name__ == "__main__":
    main(__file__, [plot_range, plot_diff, plot_parallel, plot_keys, plot_key_ranges])
