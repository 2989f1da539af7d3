"""The installed CMake package: a project outside the tree finds commsched with find_package and links the
conventional targets (commsched::api, commsched::workload, commsched::scheduler), then sums a tensor through a Context
and runs the emulated training loop on it."""
import pathlib
import subprocess

import commsched._C as C

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cmake_consumer_builds_against_the_installed_package():
    build = pathlib.Path(C.__file__).resolve().parents[2]  # <build>/python/commsched/_C*.so
    res = subprocess.run([str(ROOT / "tests/packaging/cmake_consumer.sh"), str(build)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "consumer: summed 1000 floats through commsched (1 rank)" in res.stdout
    assert "consumer: emulated 2 iterations of a 2-tensor profile" in res.stdout  # commsched::workload
