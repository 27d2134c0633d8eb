#!/usr/bin/env bash
# Prints the python of a venv holding the pinned tools of scripts/requirements.txt, creating or
# updating it (target/ci-py) when the requirements changed. Needs python3 and PyPI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/target/ci-py"
requirements="$root/scripts/requirements.txt"
stamp="$venv/requirements.txt"
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  (
    # One installer at a time: tests and scripts may ask at once.
    mkdir -p "$root/target"
    exec 9>"$root/target/ci-py.lock"
    flock 9
    if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
      [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
      cp "$requirements" "$stamp"
    fi
  )
fi
echo "$venv/bin/python"
