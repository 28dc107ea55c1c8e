#!/usr/bin/env bash
# Creates .venv and installs slowlink with torch and the development tools.
# torch is pinned first: on this project's CPU machines 2.13.0 is the CPU wheel on local disk, and an
# unpinned torch would pull a multi-GB CUDA build. On any other machine the pin installs normally.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0" numpy
.venv/bin/python -m pip install -q -e ".[torch,s3,zstd,dev]"
