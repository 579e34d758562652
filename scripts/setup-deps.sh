#!/usr/bin/env bash
# Installs every Debian 12 package MergePipe needs to build, test, fuzz, benchmark and demo.
# Idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev libcereal-dev nlohmann-json3-dev libyaml-cpp-dev libxxhash-dev
  libgtest-dev libgmock-dev
  python3 python3-numpy python3-h5py python3-yaml
  vmtouch time util-linux clang-format
  slurm-wlm munge gnuplot-nox
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup-deps: installing ${missing[*]}"
  # slurm-wlm and munge ship daemons that would start with the distribution's /etc config on a
  # machine without systemd; the tests run their own (slurm/testing/local-cluster.sh), so forbid
  # service starts during the install unless a policy is already in place.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    trap '$SUDO rm -f "$policy"' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
