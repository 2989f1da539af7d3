#!/usr/bin/env python3
"""Where a simulated iteration loses time to communication, from one `commsched bench` output folder.

The period above the compute (forward + backward) is time a worker's compute stream waited for sums. It is split into
the waits between the forward's layers, those between the backward's layers, and the rest, which is the wait before
the next forward's first layer (all of the shown iteration's gradients of layer 0 come last, at the backward's end).
For the tensor the next forward needs first (priority 0) it also gives how long after the backward's end its first
push started to leave (credit, and the pushes already queued on the uplink ahead of it) and how long from then until
its last sum was in (the servers' queues, and with every worker simulated the slowest worker's push of it).

    python3 bench/simgrid/stall_split.py OUT_DIR [POLICY]   (POLICY: a row of results.json with a timeline; default
                                                           bytescheduler)

The timeline is worker 0's last iteration (commsched bench writes timeline-<model>.json for every policy it ran);
the period is the row's iteration time, every simulated worker's mean.
"""
import json
import pathlib
import sys


def gaps(spans):
    """Total idle time between consecutive spans (sorted by start)."""
    idle, prev_end = 0.0, spans[0]["end_ms"]
    for s in spans[1:]:
        idle += max(0.0, s["start_ms"] - prev_end)
        prev_end = max(prev_end, s["end_ms"])
    return idle


def split(period_ms, spans):
    lanes = {lane: sorted((s for s in spans if s["lane"] == lane), key=lambda s: s["start_ms"])
             for lane in ("forward", "backward", "comm")}
    fwd, bwd, comm = lanes["forward"], lanes["backward"], lanes["comm"]
    if not fwd or not bwd:
        raise SystemExit("stall_split: the timeline has no forward or backward spans")
    compute = sum(s["end_ms"] - s["start_ms"] for s in fwd + bwd)
    forward_wait = gaps(fwd)
    backward_wait = gaps(bwd) + max(0.0, bwd[0]["start_ms"] - fwd[-1]["end_ms"])
    out = {"period": period_ms, "compute": compute, "forward_wait": forward_wait, "backward_wait": backward_wait,
           "before_first_layer": period_ms - compute - forward_wait - backward_wait}
    first = [s for s in comm if s["first"] == 0]
    if first:
        start = min(s["start_ms"] for s in first)
        out["first_tensor_start_after_backward"] = start - bwd[-1]["end_ms"]
        out["first_tensor_push_to_sum"] = max(s["end_ms"] for s in first) - start
    return out


def main(argv):
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    folder, policy = pathlib.Path(argv[1]), argv[2] if len(argv) == 3 else "bytescheduler"
    rows = json.loads((folder / "results.json").read_text())
    shown_any = False
    for row in rows:
        if row["policy"] != policy:
            continue
        timeline = folder / f"timeline-{row['model']}.json"
        if not timeline.exists():
            raise SystemExit(f"stall_split: {timeline} missing (commsched bench writes it beside results.json)")
        shown = json.loads(timeline.read_text())
        for p in shown["policies"]:
            if p["policy"] != policy or shown["bandwidth_bps"] != row["bandwidth_bps"] or shown["workers"] != row["workers"]:
                continue
            r = split(row["iteration_s"] * 1e3, p["spans"])
            shown_any = True
            print(f"{row['model']} {row['bandwidth_bps'] / 1e9:g} Gbit/s {row['workers']} workers {policy} "
                  f"({p['knobs']}): " + ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()))
    if not shown_any:
        raise SystemExit(f"stall_split: no row of policy '{policy}' with a timeline in {folder}")


if __name__ == "__main__":
    main(sys.argv)
