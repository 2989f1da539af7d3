"""commsched._C.mean_ci95: the C++ Student t table (base/stats.h) as the bench scripts and examples use it."""
import math
import pathlib
import subprocess
import sys

import pytest

C = pytest.importorskip("commsched._C", reason="the commsched._C extension is not built (target commsched_python)")
HERE = pathlib.Path(__file__).resolve().parent


def test_mean_ci95_uses_student_t():
    m, half = C.mean_ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and abs(half - 4.303 / math.sqrt(3)) < 1e-12
    assert C.mean_ci95([5.0]) == (5.0, 0.0)
    assert C.student_t95(30) == 2.042


def test_student_t95_refuses_zero_degrees_of_freedom():
    with pytest.raises(ValueError, match="degrees of freedom 0"):
        C.student_t95(0)


def test_ddp_bench_summary_reports_the_t_interval(tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text("plain 0 0.010\nplain 1 0.012\nhook 0 0.008\nhook 1 0.010\n")
    script = HERE.parent.parent / "bench" / "torch" / "ddp_bench.py"
    out = subprocess.run([sys.executable, str(script), "--summarize", str(runs), "plain", "hook"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    half_ms = 1e3 * 12.706 * (0.002 / math.sqrt(2)) / math.sqrt(2)  # sd of (10, 12) ms is sqrt(2) ms
    assert f"| plain | 10.0, 12.0 | 11.0 | ± {half_ms:.1f} |" in out.stdout, out.stdout
