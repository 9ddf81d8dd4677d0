#!/usr/bin/env bash
# One venv per Triton version, for tests/test_triton_versions.py:
#   tests/triton_versions/setup_venvs.sh [VERSION ...]      (default: 3.5 3.6 3.7 3.8 newest)
# Each is $DIR/triton-VERSION ($DIR: $LAZYTRITON_TRITON_VENVS, default
# ~/.cache/lazytriton-triton-venvs) with `triton==VERSION.*` ("newest": the newest
# triton on the package index), pytest, and this checkout of lazytriton, built
# once as a wheel. A venv that exists keeps its Triton ("newest" is upgraded);
# lazytriton is always reinstalled: run it again after changing lazytriton (the
# test refuses a venv built from other sources).
# PYTHON picks the interpreter (default python3; Triton 3.5 to 3.8 have wheels for 3.10-3.13).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${LAZYTRITON_TRITON_VENVS:-$HOME/.cache/lazytriton-triton-venvs}"
py="${PYTHON:-python3}"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.5 3.6 3.7 3.8 newest)
mkdir -p "$dir"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
echo "building the lazytriton wheel from $repo"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip wheel -q --no-deps -w "$wheels" "$repo"
for v in "${versions[@]}"; do
  venv="$dir/triton-$v"
  req="triton==$v.*"
  [ "$v" = newest ] && req="triton"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import triton, pytest" 2>/dev/null; then
    echo "== creating $venv ($req)"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "$req" pytest numpy "pybind11>=2.12"
  elif [ "$v" = newest ]; then
    "$venv/bin/python" -m pip install -q --upgrade triton
  fi
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$wheels"/lazytriton-*.whl
  "$py" "$here/stamp.py" "$repo" > "$venv/lazytriton-sources.sha256"  # test_triton_versions.py: stale or not
  (cd "$wheels" && "$venv/bin/python" -c "import triton, lazytriton; print('$venv: triton', triton.__version__)")
done
