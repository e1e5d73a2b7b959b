"""`notebooks/quickstart.ipynb`, executed as a user runs it: a Jupyter kernel of this Python.

The notebook is stored without outputs; here it runs in a temporary folder (its files land
there) with nbclient and the `python3` kernel of ipykernel, which jupyter_client starts with
this interpreter (`sys.executable`, the venv's) - an extra last cell checks that."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_quickstart_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("transformers")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    n_cells = len(nb.cells)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import sys, wandb_modprof\nprint(sys.executable)\nprint(wandb_modprof.__file__)"
        )
    )
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,  # per cell
        startup_timeout=120,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, with the cell's traceback, on an error

    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    streams = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    # the kernel is this interpreter, importing this checkout
    executable, module = streams.rstrip("\n").splitlines()[-2:]
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    import wandb_modprof

    assert Path(module).resolve() == Path(wandb_modprof.__file__).resolve()

    assert "wandb_modprof profile of GPT2LMHeadModel: 2 sampled step(s)" in streams
    assert "Top modules by backward time" in streams
    html = [
        out.data["text/html"]
        for out in outputs
        if out.output_type == "execute_result" and "text/html" in out.get("data", {})
    ]
    assert len(html) == 1  # the `prof` cell: Profile._repr_html_
    assert html[0].startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in html[0]
    assert "GPT2LMHeadModel profile" in html[0]
    # the files the last cell of the notebook writes, in its working folder
    from wandb_modprof import load

    assert load(tmp_path / "gpt2.modprof.json").num_samples == 2
    assert (tmp_path / "gpt2.html").read_text(encoding="utf-8").startswith("<!doctype html>")
    assert len(nb.cells) == n_cells + 1
