#!/usr/bin/env bash
# The system packages the slow suite runs against (as root, on Debian or Ubuntu): a real Slurm
# (slurmctld, slurmd and munge: tests/e2e/clusters start a controller and nodes) and a real
# browser (chromium and its driver: the dashboard's browser tests). The default suite needs
# none of them. .ci/run calls this before the slow suite.
#   sudo bash scripts/install_test_system_packages.sh
set -euo pipefail
if ! command -v apt-get >/dev/null; then
  echo "apt-get not found: install slurm-wlm, munge, chromium and chromium-driver (or your" \
    "distribution's names for them) yourself" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q slurm-wlm munge chromium chromium-driver
