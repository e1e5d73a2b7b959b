#!/usr/bin/env bash
# `make compat`: the test suite under another torch, in its own venv (.venv-compat/).
#
#   tools/compat.sh [TORCH_VERSION]      (default: $COMPAT_TORCH, else 2.14.1)
#
# torch is installed FIRST, then the package and its dev extras with a constraints file that
# pins the installed torch, so pip can never swap it for another build. The venv is reused
# while its torch is the one asked for (the package is reinstalled when pyproject.toml changes);
# asking for another torch rebuilds it.
# The registry's torch above 2.13 is a CUDA build (about 5 GB with the NVIDIA wheels, some
# minutes to install); it runs on CPU on a machine without a GPU.
# Left out: the panel/report browser tests (they need chromium and the vendored Vega) and the
# notebook (a Jupyter kernel); the benchmarks are not run.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${1:-${COMPAT_TORCH:-2.14.1}}"
VENV="${COMPAT_VENV:-.venv-compat}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"
STAMP="$VENV/.installed-torch-$TORCH_VERSION"

if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    start=$(date +%s)
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
    "$PY" -m pip freeze | grep -i '^torch==' >"$VENV/constraints.txt"
    echo "compat: installed torch $TORCH_VERSION in $(($(date +%s) - start)) s"
    touch "$STAMP"
fi
if [ ! -f "$VENV/.installed-package" ] || [ pyproject.toml -nt "$VENV/.installed-package" ]; then
    # The constraints file pins the torch installed above: pip may not replace it.
    "$PY" -m pip install -q -c "$VENV/constraints.txt" -e '.[dev]'
    touch "$VENV/.installed-package"
fi

# The torch that runs must be the one asked for (a local suffix such as +cpu is allowed).
"$PY" - "$TORCH_VERSION" <<'EOF'
import sys
import torch
want, have = sys.argv[1], torch.__version__
if have.split("+")[0] != want.split("+")[0]:
    sys.exit(f"compat: torch {have} in the venv, {want} asked for")
print(f"compat: torch {have} (CUDA build: {torch.version.cuda or 'no'}, "
      f"GPU: {torch.cuda.is_available()})")
EOF

export HF_HUB_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true
unset MODPROF_REQUIRE_BROWSER
start=$(date +%s)
status=0
"$PY" -m pytest -q -p no:cacheprovider \
    --ignore=tests/sinks/test_spec_browser.py \
    --ignore=tests/sinks/test_html_browser.py \
    --ignore=tests/sinks/test_spec_units.py \
    --ignore=tests/end_to_end/test_notebook.py \
    "${@:2}" || status=$?
echo "compat: torch $TORCH_VERSION, pytest took $(($(date +%s) - start)) s, exit $status"
exit $status
