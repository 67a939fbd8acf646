"""Plot helpers shared by bench/sets/plot.py and bench/snapshots/plot.py: matplotlib (installed
with pip if missing, no display), reading a results CSV, saving a figure, and the scripts' main."""
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

__all__ = ["plt", "rows", "save", "main"]


def rows(out, name):
    """The rows of the CSV file `name` in the results directory `out` (dicts of strings); []
    when it is missing."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def save(fig, out, name):
    """Lays out fig and writes it to `out`/`name` (PNG, 120 dpi)."""
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    plt.close(fig)


def main(script, plots):
    """Runs each plots function on the results directory given as the first argument (default:
    results/ next to `script`)."""
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(script)), "results")
    for plot in plots:
        plot(out)
    print(f"plots written to {out}")
