#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, build, and run the `exchange`
# benchmark on the embedded ResNet-50 layout with 4 MPI ranks (table on stderr, JSON on stdout).
# Extra arguments go to bench/run, e.g. `bash scripts/demo.sh --wire fp16`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
exec "$root/bench/run" exchange --layout resnet50 --ranks 4 --quick "$@"
