#!/usr/bin/env bash
# Installs every system dependency of commsched from Debian's archive.
# Idempotent and quick when everything is already there.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libtbb-dev libzmq3-dev cppzmq-dev libsodium-dev libibverbs-dev librdmacm-dev
  libucx-dev ucx-utils
  libeigen3-dev liblbfgspp-dev pybind11-dev python3-dev python3-venv python3-pip python3-pytest
  python3-torch python3-torchvision python3-numpy python3-matplotlib
  libgloo-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  iproute2 iperf3 procps
  openmpi-bin slurm-wlm munge python3-yaml
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "all system dependencies present"
fi
