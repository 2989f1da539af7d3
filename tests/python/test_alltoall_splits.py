"""The one check of alltoall's splits, shared by commsched.torch and commsched.tensorflow."""
import pytest

pytest.importorskip("commsched._C", reason="the commsched._C extension is not built (target commsched_python)")
from commsched._host_collectives import alltoall_splits  # noqa: E402


def test_equal_blocks_without_splits():
    assert alltoall_splits("x", 6, 3, None) == [2, 2, 2]
    with pytest.raises(ValueError, match="alltoall 'x': 7 rows do not split equally over 3 ranks"):
        alltoall_splits("x", 7, 3, None)


def test_given_splits_must_cover_the_rows():
    assert alltoall_splits("x", 5, 2, [2, 3]) == [2, 3]
    for bad in ([2, 2], [6, -1], [5]):
        with pytest.raises(ValueError, match=r"alltoall 'x': splits=.* must be 2 non-negative counts summing to the 5"):
            alltoall_splits("x", 5, 2, bad)
