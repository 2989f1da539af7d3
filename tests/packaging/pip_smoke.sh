#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment that sees Debian's torch, then a smoke run of what it installed:
# commsched.torch (the Horovod-style API on one rank, and on two ranks under the installed `commsched launch`).
#   tests/packaging/pip_smoke.sh [VENV_DIR]      (default: a temporary folder, deleted afterwards)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
venv=${1:-}
if [[ -z $venv ]]; then
  venv=$(mktemp -d)
  trap 'rm -rf "$venv"' EXIT
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q "$src"
cd "$venv"  # not the source tree: the installed package must be the one imported
smoke='import torch, commsched.torch as hvd
hvd.init()
s = hvd.allreduce(torch.ones(3), op=hvd.Sum)
g = hvd.allgather(torch.tensor([hvd.rank()]))
assert s.tolist() == [float(hvd.size())] * 3 and g.tolist() == list(range(hvd.size())), (s, g)
print("pip smoke: rank", hvd.rank(), "of", hvd.size(), "ok")
hvd.shutdown()'
"$venv/bin/python" -c "$smoke"
"$venv/bin/commsched" launch -w 2 -s 1 -- "$venv/bin/python" -c "$smoke"
