#!/usr/bin/env bash
# Makes (once) the test venv and prints its python: a current torch 2.x, tensorflow-cpu and Ray from PyPI
# (tests/python/requirements-venv.txt), beside Debian's torch 1.13 that /usr/bin/python3 keeps, so the Python suite
# runs on both torch generations. Cached between local runs in ${COMMSCHED_TEST_VENV:-~/.cache/commsched/test-venv};
# remade when the requirement list changes. /usr/bin/python3 so the ABI matches the commsched._C the build made.
set -euo pipefail
cd "$(dirname "$0")/.."
req=tests/python/requirements-venv.txt
venv=${COMMSCHED_TEST_VENV:-$HOME/.cache/commsched/test-venv}
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [[ ! -x $venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "== making the test venv in $venv (torch 2.x, tensorflow-cpu, ray: a few minutes the first time)" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$req" >&2
  echo "$want" >"$stamp"
fi
echo "$venv/bin/python"
