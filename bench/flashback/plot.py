#!/usr/bin/env python3
"""Plots the results of bench/flashback/bench.py.

Usage: plot.py RESULTS_DIR. Writes next to the CSV files:
  restore.png  seconds to restore the table to the snapshot, gsnap_restore against DELETE +
               INSERT ... SELECT FROM gsnap_asof, per fraction of rows changed since.
  undrop.png   seconds to bring back a dropped table, gsnap_undrop against CREATE TABLE AS
               (alone, and with the same index builds), and for a table without indexes,
               per round.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plotting import main, plt, rows, save  # noqa: E402


def plot_restore(out):
    data = rows(out, "restore.csv")
    if not data:
        return
    fractions = sorted({float(r["fraction"]) for r in data})

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    ours = [median([float(r["restore_s"]) for r in data if float(r["fraction"]) == f]) for f in fractions]
    theirs = [median([float(r["handwritten_s"]) for r in data if float(r["fraction"]) == f]) for f in fractions]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = range(len(fractions))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="gsnap_restore", color="tab:green")
    ax.bar([i + 0.2 for i in x], theirs, width=0.4, label="DELETE + INSERT ... FROM gsnap_asof", color="tab:grey")
    ratios = [median([float(r["ratio"]) for r in data if float(r["fraction"]) == f]) for f in fractions]
    for i, (o, ratio) in enumerate(zip(ours, ratios)):
        ax.text(i - 0.2, o, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"{f:.1%} of rows changed" for f in fractions])
    ax.set_ylabel("seconds (median)")
    ax.set_title("Restoring a table to a snapshot")
    ax.legend()
    save(fig, out, "restore.png")


def plot_undrop(out):
    data = rows(out, "undrop.csv")
    if not data:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = range(len(data))
    bars = [("undrop_s", "gsnap_undrop (PK + index)", "tab:green"),
            ("ctas_s", "CREATE TABLE AS (no index)", "tab:grey"),
            ("ctas_indexes_s", "CREATE TABLE AS + PK + index", "tab:blue"),
            ("bare_undrop_s", "gsnap_undrop, table without indexes", "tab:olive"),
            ("bare_ctas_s", "CREATE TABLE AS, same table", "tab:brown")]
    bars = [b for b in bars if b[0] in data[0]]
    width = 0.8 / len(bars)
    for j, (key, label, color) in enumerate(bars):
        off = (j - (len(bars) - 1) / 2) * width
        ax.bar([i + off for i in x], [float(r[key]) for r in data], width=width, label=label, color=color)
    ax.set_xticks(list(x), [f"round {r['round']}" for r in data])
    ax.set_ylabel("seconds")
    ax.set_title("Bringing back a dropped table")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, fontsize=8)
    save(fig, out, "undrop.png")


if __name__ == "__main__":
    main(__file__, [plot_restore, plot_undrop])
