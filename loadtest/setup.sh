#!/usr/bin/env bash
# Installs what the load scenarios need beyond the project: wrk and nginx (Debian packages,
# needs root) and matplotlib for the charts (the project's `loadtest` extra, into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v ip >/dev/null || missing+=(iproute2)
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "need root to install: ${missing[*]} (apt-get install -y ${missing[*]})" >&2
        exit 1
    fi
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}"
fi

if [[ ! -x .venv/bin/python ]]; then
    scripts/bootstrap  # .venv with the project and its test tools (moto, boto3)
fi
# matplotlib comes with the project's `loadtest` extra; where pyproject has no such extra
# yet, pip ignores the name, so install the same pin directly.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,loadtest]'
.venv/bin/python -c 'import matplotlib' 2>/dev/null ||
    .venv/bin/python -m pip install -q --disable-pip-version-check 'matplotlib==3.11.2'
.venv/bin/python -c 'import matplotlib, moto, boto3' && echo "loadtest: ready"
