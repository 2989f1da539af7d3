"""A tensor the ranks name differently can never be reduced: without a stall report each rank would wait for the
other for ever, silently. Rank 0 of the all-reduce, or the PS server holding it, logs who submitted what and who is
missing after COMMSCHED_STALL_CHECK, and with COMMSCHED_STALL_SHUTDOWN every rank's call fails naming the rank it
waited for (Horovod's stall inspector, HOROVOD_STALL_* honoured too)."""
import pytest

from torch_cluster import launch

SCRIPT = r'''
import sys
import commsched.torch as hvd, torch
hvd.init()
name = "metric" if hvd.rank() == 0 else "metric.renamed"  # rank 1 names it differently
try:
    hvd.allreduce(torch.ones(4), name=name)
    outcome = "no error"
except Exception as e:  # noqa: BLE001 -- the test reads the message
    outcome = f"failed: {e}"
with open(f"{sys.argv[1]}/rank{hvd.rank()}.txt", "w") as f:  # a file each: two ranks' lines may run together
    f.write(outcome)
hvd.shutdown()
'''


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_a_tensor_named_differently_is_reported_then_fails_naming_the_rank_missing(tmp_path, servers):
    script = tmp_path / "renamed.py"
    script.write_text(SCRIPT)
    rc, log = launch(2, [script, tmp_path], servers=servers, timeout=90,
                     env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "COMMSCHED_STALL_SHUTDOWN": "3s"})
    assert "stalled:" in log and "Every rank must submit the same tensors under the same names" in log, log
    waiter = "worker" if servers else "rank"
    for rank, other in ((0, 1), (1, 0)):
        outcome = (tmp_path / f"rank{rank}.txt").read_text()
        assert outcome.startswith("failed:") and f"for {waiter} {other} (" in outcome, f"{outcome}\n{log}"
        assert "COMMSCHED_STALL_SHUTDOWN" in outcome, f"{outcome}\n{log}"
