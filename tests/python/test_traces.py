"""Traces: under `commsched launch` every rank writes its own file (rank in the name), and `commsched trace-merge`
joins them into one Chrome/Perfetto trace with a track per rank, timestamps aligned at the rendezvous."""
import json
import pathlib
import subprocess

import pytest

from torch_cluster import HERE, commsched_bin, launch


def spans(events, pid, cat):
    """(name, begin, end) of every complete async span of `cat` on track `pid`."""
    open_, out = {}, []
    for e in events:
        if e.get("pid") != pid or e.get("cat") != cat:
            continue
        if e["ph"] == "b":
            open_[e["id"]] = e
        elif e["ph"] == "e":
            b = open_.pop(e["id"])
            out.append((b["name"], b["ts"], e["ts"]))
    assert not open_, f"unclosed spans on rank {pid}: {list(open_)[:3]}"
    return out


def check_perfetto_json(events):
    """What Perfetto's JSON importer needs: an array of events with ph and pid; ts on every non-metadata event;
    async begin/end pairs with ids that no two tracks share."""
    assert isinstance(events, list) and events
    owner = {}
    for e in events:
        assert isinstance(e, dict) and "ph" in e and isinstance(e.get("pid"), int), e
        if e["ph"] != "M":
            assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if e["ph"] in ("b", "e"):
            assert owner.setdefault(e["id"], e["pid"]) == e["pid"], f"id {e['id']} on two tracks"


def test_per_rank_files_merge_into_one_aligned_trace(tmp_path):
    rc, log = launch(2, [HERE / "trace_worker.py"], env={"COMMSCHED_TIMELINE": tmp_path / "trace.json"})
    assert rc == 0, log
    files = [tmp_path / f"trace.rank{r}.json" for r in range(2)]
    assert all(f.exists() for f in files), sorted(p.name for p in tmp_path.iterdir())
    merged = tmp_path / "merged.json"
    res = subprocess.run([commsched_bin(), "trace-merge", "-o", merged] + files, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    events = json.loads(merged.read_text())
    check_perfetto_json(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    probe = {}
    for r in range(2):
        comm = spans(events, r, "communicating")
        assert any(n.startswith("grad.") for n, _, _ in comm), f"rank {r} traced no gradients"
        probe[r] = [end for n, _, end in comm if n == "aligned.probe"]
        assert len(probe[r]) == 1
    # A collective ends at the same moment on both ranks; on clocks aligned at the rendezvous the ends agree.
    assert abs(probe[0][0] - probe[1][0]) < 500_000, f"probe ends {probe} (us) are not aligned"


@pytest.mark.parametrize("variable", ["COMMSCHED_TIMELINE", "HOROVOD_TIMELINE"])
def test_the_timeline_variable_of_a_horovod_job_writes_a_trace_per_rank(tmp_path, variable):
    rc, log = launch(2, [HERE / "trace_worker.py"], env={variable: tmp_path / "t.json"})
    assert rc == 0, log
    assert sorted(f.name for f in tmp_path.iterdir()) == ["t.rank0.json", "t.rank1.json"], log


def test_horovod_dynamic_timeline_waits_for_start_timeline(tmp_path):
    rc, log = launch(2, [HERE / "trace_worker.py"], env={"HOROVOD_TIMELINE": "DYNAMIC"})
    assert rc == 0, log
    assert not list(tmp_path.iterdir()) and not pathlib.Path("DYNAMIC.rank0.json").exists(), log


def test_merge_refuses_two_files_of_one_rank(tmp_path):
    rc, log = launch(2, [HERE / "trace_worker.py"], env={"COMMSCHED_TIMELINE": tmp_path / "t.json"}, servers=0)
    assert rc == 0, log
    f = tmp_path / "t.rank0.json"
    res = subprocess.run([commsched_bin(), "trace-merge", "-o", tmp_path / "m.json", f, f], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode != 0 and "both rank 0" in res.stderr, res.stderr
