"""examples/pytorch_train.py --target-loss: steps-to-loss is the first step whose running loss (over the workers and
--loss-window steps) is below the target, and time-to-loss is those steps at the measured mean step time."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pytorch_train.py"


def run(tmp_path, *args):
    result = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(TRAIN), "--steps", "20", "--warmup", "2", *map(str, args),
                        "--result", str(result)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(result.read_text()), p.stdout


def test_steps_to_loss_is_the_first_running_mean_below_the_target(tmp_path):
    r, out = run(tmp_path, "--target-loss", 2.0, "--loss-window", 3)
    losses = r["loss_per_step"]
    assert len(losses) == 20
    running = [sum(losses[n - 3:n]) / 3 for n in range(3, 21)]
    want = next(n for n, m in zip(range(3, 21), running) if m < 2.0)  # the loss starts near 2.3 and falls below 2
    assert r["steps_to_loss"] == want, r
    assert abs(r["time_to_loss_s"] - want * r["step_ms"] / 1e3) < 1e-9
    assert f"steps to loss 2.0: {want} " in out


def test_an_unreached_target_says_so(tmp_path):
    r, out = run(tmp_path, "--target-loss", 0.0)
    assert r["steps_to_loss"] is None and r["time_to_loss_s"] is None
    assert "not reached" in out
