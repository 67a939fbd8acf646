#!/usr/bin/env python3
"""Plots the results of bench/snapshots/bench.py.

Usage: plot.py RESULTS_DIR. Writes next to the CSV files:
  tps.png       TPS per round and configuration, and TPS per second of one round with the
                snapshot declarations marked;
  declare.png   declaration and time-to-durable latencies (idle, under load) and pgbench
                latency over time with the declarations marked;
  capture.png   the gsnap worker's memory and the capture progress during the captures;
  asof.png      live vs AS OF query times, cold and warm.
Each plot is skipped when its CSV is missing. Installs matplotlib with pip if it is missing.
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from plotting import main, plt, rows, save  # noqa: E402

COLORS = {"heap": "tab:grey", "gsnap": "tab:blue", "gsnap+snap": "tab:orange"}


def plot_tps(out):
    runs = rows(out, "tps.csv")
    series = rows(out, "tps_series.csv")
    if not runs:
        return
    configs = ["heap", "gsnap", "gsnap+snap"]
    rounds = sorted({int(r["round"]) for r in runs})

    def run_of(k, cfg):
        return next(r for r in runs if int(r["round"]) == k and r["config"] == cfg)

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    w = 0.27
    ax = axes[0]
    heap = {k: float(run_of(k, "heap")["tps"]) for k in rounds}
    for i, cfg in enumerate(configs):
        vals = [float(run_of(k, cfg)["tps"]) for k in rounds]
        ax.bar([k + (i - 1) * w for k in rounds], vals, w, label=cfg, color=COLORS[cfg])
        if cfg != "heap":
            for k, v in zip(rounds, vals):
                ax.text(k + (i - 1) * w, v * 0.5, f"{v / heap[k]:.2f}", ha="center", va="center", fontsize=7,
                        rotation=90, color="white")
    ax.set(xlabel="round", ylabel="TPS", title="pgbench TPS per round\n(in the bars: ratio to heap, same round)")
    ax.set_xticks(rounds)
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[1]
    for i, cfg in enumerate(configs):
        tot = [float(run_of(k, cfg)["cpu_us_per_xact"]) for k in rounds]
        share = [float(run_of(k, cfg).get("worker_cpu_share") or 0) for k in rounds]
        xs = [k + (i - 1) * w for k in rounds]
        ax.bar(xs, [t * (1 - s) for t, s in zip(tot, share)], w, color=COLORS[cfg], label=f"{cfg}: backends etc.")
        if any(share):
            ax.bar(xs, [t * s for t, s in zip(tot, share)], w, bottom=[t * (1 - s) for t, s in zip(tot, share)],
                   color="tab:red", label="gsnap worker (captures)" if cfg == "gsnap+snap" else None)
    ax.set(xlabel="round", ylabel="server CPU per transaction (us)",
           title="Server CPU per transaction\n(all server processes; robust to the machine's noise)")
    ax.set_xticks(rounds)
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[2]
    # TPS (relative to the run's median) by seconds since the last snapshot declaration,
    # averaged over all rounds; heap and gsnap at the same seconds of their runs as controls
    period = None
    for cfg in configs:
        acc: dict[int, list[float]] = defaultdict(list)
        for k in rounds:
            sec = [r for r in series if int(r["round"]) == k and r["config"] == cfg and r["kind"] == "second"]
            snaps = sorted(float(r["t"]) for r in series
                           if int(r["round"]) == k and r["config"] == "gsnap+snap" and r["kind"] == "snapshot")
            if len(snaps) >= 2:
                period = round(snaps[1] - snaps[0])
            vals = [int(r["tps"]) for r in sec][1:-1]
            if not vals:
                continue
            med = sorted(vals)[len(vals) // 2]
            for r in sec[1:-1]:
                t = int(r["t"])
                if period and t >= period:
                    acc[(t - 0) % period].append(int(r["tps"]) / med)
        if acc:
            xs = sorted(acc)
            ax.plot(xs, [sum(acc[x]) / len(acc[x]) for x in xs], "o-", color=COLORS[cfg], label=cfg, ms=3)
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set(xlabel="seconds since the last snapshot declaration (gsnap+snap; same second of the run for the others)",
           ylabel="TPS / median TPS of the run", title="TPS around snapshots, averaged over all snapshots of all rounds")
    ax.xaxis.label.set_size(8)
    ax.legend(fontsize=7)
    save(fig, out, "tps.png")


def plot_declare(out):
    samples = rows(out, "declare.csv")
    pg = rows(out, "declare_pgbench.csv")
    if not samples:
        return
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8))
    ax = axes[0]
    groups = [("idle", "declare"), ("idle", "declare_64k"), ("idle", "declare_many"), ("load", "declare"),
              ("load", "declare_b32"), ("load", "select1"), ("idle", "durable"), ("load", "durable")]
    names = {"declare": "declare\n(wait => false)", "declare_64k": "declare,\nmax_dirty_pages\n= 65536",
             "declare_many": "declare,\n5,000 more\ntables", "declare_b32": "declare,\ncapture_batch\n_pages = 32",
             "select1": "SELECT 1\n(baseline)", "durable": "until durable\n(wait => true)"}
    data, labels = [], []
    for phase, kind in groups:
        v = [float(s["ms"]) for s in samples if s["phase"] == phase and s["kind"] == kind]
        if v:
            data.append(v)
            labels.append(f"{names[kind]}\n{phase}")
    ax.boxplot(data, whis=(5, 95), showfliers=True, flierprops={"markersize": 3})
    ax.set_xticks(range(1, len(labels) + 1))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.axhline(5, color="red", ls="--", lw=0.8, label="5 ms target (declaration)")
    ax.set(ylabel="ms (client side)", title="Declaration latency (whiskers p5-p95)")
    ax.legend(fontsize=8)
    ax = axes[1]
    if pg:
        t = [float(r["t"]) for r in pg]
        ax.plot(t, [float(r["lat_max_ms"]) for r in pg], "-", lw=0.6, color="tab:red", label="max per 100 ms")
        ax.plot(t, [float(r["lat_p50_ms"]) for r in pg], "-", lw=0.6, color="tab:blue", label="median per 100 ms")
        first = True
        for s in samples:
            if s["phase"] == "load" and s["kind"] != "select1":
                ax.axvline(float(s["t"]), color="tab:purple" if s["kind"] == "durable" else "tab:green",
                           lw=0.4, alpha=0.5,
                           label=("declarations (left: no wait, right: wait)" if first else None))
                first = False
        ax.set_yscale("log")
        ax.set(xlabel="seconds into the pgbench run", ylabel="pgbench latency (ms)",
               title="pgbench latency around declarations")
        ax.legend(fontsize=8, loc="upper right")
    save(fig, out, "declare.png")


def plot_capture(out):
    rss = rows(out, "capture_rss.csv")
    if not rss:
        return
    caps = []
    for r in rss:
        if r["capture"] not in caps:
            caps.append(r["capture"])
    fig, axes = plt.subplots(1, len(caps), figsize=(5 * len(caps), 4), squeeze=False)
    for ax, cap in zip(axes[0], caps):
        sel = [r for r in rss if r["capture"] == cap]
        t = [float(r["t"]) for r in sel]
        ax.plot(t, [int(r["rss_anon_kb"]) / 1024 for r in sel], "-", color="tab:red", label="RssAnon (private)")
        ax.plot(t, [int(r["rss_shmem_kb"]) / 1024 for r in sel], "--", color="tab:grey", label="RssShmem (shared buffers touched)")
        ax.set(xlabel="seconds", ylabel="worker memory (MiB)", title=cap)
        ax2 = ax.twinx()
        ax2.plot(t, [int(r["pages_done"] or 0) / 1000 for r in sel], ":", color="tab:blue", label="pages done (k)")
        ax2.set_ylabel("pages captured (thousands)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    save(fig, out, "capture.png")


def plot_asof(out):
    data = rows(out, "asof.csv")
    if not data:
        return
    med = defaultdict(list)
    for r in data:
        med[(r["query"], r["source"], r["mode"], r["phase"])].append(float(r["ms"]))
    queries = []
    for r in data:
        if r["query"] not in queries:
            queries.append(r["query"])
    bars = [("live", "serial", "cold", "live cold", "tab:grey"), ("asof", "serial", "cold", "AS OF cold", "tab:orange"),
            ("live", "serial", "warm", "live warm (serial)", "silver"),
            ("live", "parallel", "warm", "live warm (parallel)", "gainsboro"),
            ("asof", "serial", "warm", "AS OF warm", "tab:blue"),
            ("asof_fscan", "serial", "warm", "AS OF warm, function scan", "lightsteelblue"),
            ("asof", "serial", "bigcache", "AS OF warm, image cache > table", "tab:green"),
            ("live_part", "parallel", "warm", "partitioned, live (parallel)", "wheat"),
            ("asof_part", "parallel", "warm", "partitioned, AS OF (parallel)", "tab:purple")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = [x for x in bars if (queries[0], x[0], x[1], x[2]) in med]
    w = 0.8 / len(bars)
    for i, (src, mode, phase, label, color) in enumerate(bars):
        vals = []
        for q in queries:
            v = sorted(med.get((q, src, mode, phase), [float("nan")]))
            vals.append(v[len(v) // 2])
        ax.bar([k + (i - (len(bars) - 1) / 2) * w for k in range(len(queries))], vals, w, label=label, color=color)
    ax.set_xticks(range(len(queries)))
    ax.set_xticklabels({"count": "SELECT count(*)", "scan": "sum(abalance), max(filler)"}.get(q, q) for q in queries)
    ax.set(ylabel="ms (median)", title="pgbench_accounts: live vs gsnap_asof() at the latest snapshot")
    ax.legend(fontsize=8)
    save(fig, out, "asof.png")


if __name__ == "__main__":
    main(__file__, [plot_tps, plot_declare, plot_capture, plot_asof])
