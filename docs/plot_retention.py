#!/usr/bin/env python3
"""Draws docs/retention.png: what a retention policy keeps of 400 days of hourly snapshots.

Usage (from the repository root, with the benchmarks' Python environment):
    cargo run --release -q -p gsnap-lifetimes --example keep_map > /tmp/keep.csv
    python docs/plot_retention.py /tmp/keep.csv docs/retention.png
"""
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from plotting import plt  # noqa: E402

ROWS = ["not selected", "yearly", "monthly", "weekly", "daily", "hourly", "within", "newest"]
COLORS = {"yearly": "tab:purple", "monthly": "tab:blue", "weekly": "tab:cyan", "daily": "tab:green",
          "hourly": "tab:olive", "within": "tab:orange", "newest": "tab:red"}


def main(src: str, dst: str) -> None:
    with open(src) as f:
        policy = f.readline().strip().removeprefix("# policy: ")
        data = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for rule in ROWS:
        pts = [float(r["age_days"]) for r in data if r["rule"] == rule]
        if not pts:
            continue
        y = [ROWS.index(rule)] * len(pts)
        if rule == "not selected":
            ax.scatter(pts, y, s=2, color="lightgrey", label=f"deleted ({len(pts)})")
        else:
            ax.scatter(pts, y, s=18, color=COLORS[rule], label=f"{rule} ({len(pts)})")
    ax.set_xscale("log")
    ax.set_xlim(500, 0.02)  # oldest on the left
    ax.set_xlabel("age at the end of the run (days, log scale); each kept snapshot on the row of the coarsest rule keeping it")
    ax.set_yticks(range(len(ROWS)), ["deleted", *ROWS[1:]])
    kept = sum(1 for r in data if r["keep"] == "1")
    ax.set_title(f"400 days of hourly snapshots (3 days of downtime 20 days ago): {kept} of {len(data)} kept\n"
                 f"policy '{policy}'", fontsize=10)
    ax.axvspan(23, 20, color="mistyrose", label="server down")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    ax.grid(axis="x", which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
