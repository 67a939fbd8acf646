#!/usr/bin/env python3
"""Plots the CSV files written by the index benchmark (crates/core/examples/index_bench.rs).

Usage: plot.py RESULTS_DIR. Writes memory.png (Figure 14 shape), lookup.png (Figure 12 shape:
lookup time vs number of snapshots), group_length.png (Figure 10 shape) and skippy.png (Table I
shape) next to the CSV files. Installs matplotlib with pip if it is missing.
"""
import csv
import os
import subprocess
import sys

try:
    import matplotlib
except ImportError:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"])
    import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_memory(out):
    data = rows(os.path.join(out, "memory.csv"))
    if not data:
        return
    last = max(int(r["snapshots"]) for r in data)
    data = [r for r in data if int(r["snapshots"]) == last]
    skews = sorted({r["skew"] for r in data}, key=lambda s: [r["skew"] for r in data].index(s))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for skew in skews:
        sel = [r for r in data if r["skew"] == skew]
        p = [float(r["p_write"]) * 100 for r in sel]
        axes[0].plot(p, [int(r["gsnap_bytes"]) / 2**20 for r in sel], "o-", label=f"GSnap {skew}")
        axes[0].plot(p, [int(r["oindex_bytes"]) / 2**20 for r in sel], "s--", label=f"O-index {skew}")
        axes[0].plot(p, [int(r["tindex_bytes"]) / 2**20 for r in sel], "^:", label=f"T-index {skew}")
        axes[1].plot(p, [float(r["ratio_o_over_g"]) for r in sel], "o-", label=f"measured {skew}")
        axes[1].plot(p, [float(r["model_p_node"]) for r in sel], "k+", markersize=10)
        axes[1].plot(p, [float(r["model_p_page"]) for r in sel], "x", color="grey", markersize=6)
    axes[0].set(xlabel="update ratio (% of pages written per snapshot)", ylabel="index memory (MiB)",
                title=f"Index memory at {last} snapshots")
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].set(xlabel="update ratio (%)", ylabel="O-index / GSnap memory",
                title="Ratio to O-index (+: model with P = M_p/M_c, x: with P = pages)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=120)


def plot_lookup(out):
    data = rows(os.path.join(out, "lookup.csv"))
    if not data:
        return
    p = min(float(r["p_write"]) for r in data)
    skews = list(dict.fromkeys(r["skew"] for r in data))
    fig, axes = plt.subplots(2, len(skews), figsize=(4 * len(skews), 7), squeeze=False)
    for col, skew in enumerate(skews):
        sel = [r for r in data if r["skew"] == skew and float(r["p_write"]) == p]
        n = [int(r["snapshots"]) for r in sel]
        for row, suffix, where in ((0, "ns", "random snapshot of all"), (1, "local_ns", "snapshot of the newest 20")):
            ax = axes[row][col]
            for idx, label, style in (("gsnap", "GSnap", "o-"), ("tindex", "T-index", "^:"), ("oindex", "O-index", "s--")):
                ax.plot(n, [float(r[f"{idx}_{suffix}"]) for r in sel], style, label=label)
            if row == 0:
                ax.plot(n, [float(r["gsnap_tree_ns"]) for r in sel], "o-.", label="GSnap, resolved tree")
            ax.set_yscale("log")
            ax.set(xlabel="snapshots", ylabel="ns per page lookup", title=f"{skew}, P = {p:.0%}: {where}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "lookup.png"), dpi=120)


def plot_group_length(out):
    data = rows(os.path.join(out, "group_length.csv"))
    if not data:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    l = [int(r["group_len"]) for r in data]
    for col, label in (("memory_saving", "memory saving vs O-index"), ("load_saving", "load saving vs T-index"), ("benefit", "benefit (0.5/0.5)")):
        ax.plot(l, [float(r[col]) for r in data], "o-", label=label)
    ax.set_ylim(-1, 1)
    ax.set(xlabel="group length", ylabel="fraction", title="Restoring one snapshot group")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "group_length.png"), dpi=120)


def plot_skippy(out):
    data = rows(os.path.join(out, "skippy.csv"))
    if not data:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for skew in dict.fromkeys(r["skew"] for r in data):
        sel = [r for r in data if r["skew"] == skew]
        ax.plot([int(r["height"]) for r in sel], [float(r["ms"]) for r in sel], "o-", label=skew)
    ax.set_yscale("log")
    ax.set(xlabel="Skippy height", ylabel="ms to build one SPT", title="SPT construction vs height")
    ax.set_xticks([0, 1, 2, 3])
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "skippy.png"), dpi=120)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results")
    for f in (plot_memory, plot_lookup, plot_group_length, plot_skippy):
        f(out)
    print(f"plots written to {out}")


if __name__ == "__main__":
    main()
