#!/usr/bin/env python3
"""Plots the results of bench/lifetimes/bench.py.

Usage: plot.py RESULTS_DIR. Writes next to the CSV files:
  steady.png   over the steady-state run: the store's size on disk and the snapshots kept,
               with the retention policy and without (top); TPS per second of both (bottom);
  reclaim.png  bytes reclaimed over time after every other snapshot was deleted, and the
               worker's memory meanwhile;
  logrewrite.png  the resident memory while the mapping log is rewritten, per log size, with
               what the rewrite that built the new log in memory needed.
Each plot is skipped when its CSV is missing.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plotting import main, plt, rows, save  # noqa: E402


def num(v):
    return float(v) if v not in ("", None) else float("nan")


def plot_steady(out):
    data = rows(out, "steady.csv")
    if not data:
        return
    t = [num(r["t"]) / 60 for r in data]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    for k, label, color in (("policy", "retention policy", "tab:green"), ("keepall", "keep everything", "tab:red")):
        top.plot(t, [num(r[f"{k}_disk"]) / 2**20 for r in data], color=color, label=f"{label}: store on disk")
        top.plot(t, [num(r[f"{k}_content"]) / 2**20 for r in data], color=color, linestyle=":",
                 label=f"{label}: live content")
        bottom.plot(t, [num(r[f"{k}_tps"]) for r in data], color=color, label=label, linewidth=0.8)
    twin = top.twinx()
    twin.plot(t, [num(r["policy_snapshots"]) for r in data], color="tab:green", linestyle="--", alpha=0.5)
    twin.plot(t, [num(r["keepall_snapshots"]) for r in data], color="tab:red", linestyle="--", alpha=0.5)
    twin.set_ylabel("snapshots kept (dashed)")
    top.set_ylabel("MB")
    top.set_title("Store size under pgbench with a snapshot every few seconds")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylabel("TPS (per second)")
    bottom.set_xlabel("minutes")
    bottom.legend(fontsize=8)
    save(fig, out, "steady.png")


def plot_reclaim(out):
    data = rows(out, "reclaim.csv")
    if not data:
        return
    t = [num(r["t"]) for r in data]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [num(r["reclaimed_bytes"]) / 2**20 for r in data], color="tab:blue", label="reclaimed (MB)")
    ax.set_xlabel("seconds after the deletion")
    ax.set_ylabel("MB reclaimed")
    twin = ax.twinx()
    twin.plot(t, [num(r["rss_kb"]) / 1024 for r in data], color="tab:grey", linestyle=":", label="worker RSS (MB)")
    twin.set_ylabel("worker RSS (MB, dotted)")
    ax.set_title("Reclaiming every other snapshot (a kill -9 in the middle)")
    save(fig, out, "reclaim.png")


def plot_logrewrite(out):
    import json
    summary = os.path.join(out, "summary.json")
    runs = json.load(open(summary)).get("logrewrite", []) if os.path.exists(summary) else []
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for r, color in zip(runs, colors):
        data = rows(out, f"logrewrite_{r['mappings_before']}.csv")
        if not data:
            continue
        label = f"{r['mappings_before'] / 1e6:.0f} M mappings ({r['mappings_after'] / 1e6:.1f} M kept)"
        ax.plot([num(d["t"]) for d in data], [num(d["rss_kb"]) / 1024 for d in data], color=color, label=label)
        ax.axhline(r["rss_start_mb"] + r["in_memory_rewrite_estimate_mb"], color=color, linestyle=":",
                   label=f"the in-memory rewrite for {r['mappings_after'] / 1e6:.1f} M (estimate)")
    ax.set_xlabel("seconds into the rewrite (then switch and compaction)")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title("Rewriting the mapping log: memory does not follow the log's size")
    ax.legend(fontsize=8)
    save(fig, out, "logrewrite.png")


if __name__ == "__main__":
    main(__file__, [plot_steady, plot_reclaim, plot_logrewrite])
