#!/usr/bin/env python3
"""Draws the PNGs for a `commsched bench` output folder (results.csv, timeline-*.json):

  speedup-<model>.png   speedup over WFBP against bandwidth, one line per policy (one panel per worker count)
  timeline-<model>.png  one iteration per policy: forward / backward compute and each message on the wire

Usage: /usr/bin/python3 simulator/plot.py <bench output folder>
"""
import csv
import glob
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_STYLE = {"bytescheduler": ("tab:red", "o"), "wfbp": ("tab:gray", "s"), "bsp": ("tab:brown", "v"),
                "fusion": ("tab:blue", "^"), "mgwfbp": ("tab:green", "D")}


def read_results(folder):
    with open(os.path.join(folder, "results.csv")) as f:
        return list(csv.DictReader(f))


def plot_speedups(rows, folder):
    by_model = defaultdict(list)
    for r in rows:
        by_model[r["model"]].append(r)
    written = []
    for model, rs in by_model.items():
        workers = sorted({int(r["workers"]) for r in rs})
        fig, axes = plt.subplots(1, len(workers), figsize=(5 * len(workers), 3.8), squeeze=False)
        for ax, w in zip(axes[0], workers):
            lines = defaultdict(list)
            for r in rs:
                if int(r["workers"]) == w:
                    lines[r["policy"]].append((float(r["bandwidth_gbps"]), float(r["speedup_vs_wfbp"])))
            for policy, pts in lines.items():
                pts.sort()
                color, marker = POLICY_STYLE.get(policy, ("black", "x"))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=policy)
            ax.set_xscale("log")
            ax.axhline(1.0, color="black", linewidth=0.5)
            ax.set_xlabel("bandwidth (Gbit/s)")
            ax.set_ylabel("speedup over WFBP")
            ax.set_title(f"{model}, {w} workers")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(folder, f"speedup-{model}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_timeline(path, folder):
    with open(path) as f:
        d = json.load(f)
    policies = d["policies"]
    fig, axes = plt.subplots(len(policies), 1, figsize=(12, 1.6 * len(policies) + 0.6), sharex=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    max_prio = max((s["last"] for p in policies for s in p["spans"] if s["lane"] == "comm"), default=1) or 1
    for ax, p in zip(axes[:, 0], policies):
        # One broken_barh per lane: thousands of partitions stay fast to draw.
        for row, lane, color in ((2, "forward", "tab:blue"), (1, "backward", "tab:orange")):
            spans = [(s["start_ms"], s["end_ms"] - s["start_ms"]) for s in p["spans"] if s["lane"] == lane]
            ax.broken_barh(spans, (row + 0.1, 0.8), facecolors=color, edgecolor="white", linewidth=0.2)
        comm = [s for s in p["spans"] if s["lane"] == "comm"]
        # colour by the batch's most urgent priority (dark = layer 0)
        ax.broken_barh([(s["start_ms"], s["end_ms"] - s["start_ms"]) for s in comm], (0.1, 0.8),
                       facecolors=[cmap(min(s["first"], s["last"]) / max_prio) for s in comm],
                       edgecolor="black", linewidth=0.2, alpha=0.8)
        ax.set_yticks([0.5, 1.5, 2.5])
        ax.set_yticklabels(["comm", "backward", "forward"])
        ax.set_title(f"{p['policy']}  {p['knobs']}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from the iteration's start (comm colour: priority, dark = first layer)")
    fig.suptitle(f"{d['model']}: one iteration, {d['workers']} workers, {d['bandwidth_bps'] / 1e9:g} Gbit/s")
    fig.tight_layout()
    out = os.path.join(folder, f"timeline-{d['model']}.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    written = plot_speedups(read_results(folder), folder)
    for path in sorted(glob.glob(os.path.join(folder, "timeline-*.json"))):
        written.append(plot_timeline(path, folder))
    print("plot.py: wrote " + ", ".join(os.path.basename(p) for p in written))


if __name__ == "__main__":
    main()
