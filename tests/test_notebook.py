"""notebooks/quickstart.ipynb, executed top to bottom: its cells assert their own results.

The notebook runs in its own kernel process (it starts its own SparkSession, which cannot
share this process with the suite's). The kernel is this interpreter: a kernelspec written to
a temporary directory points at ``sys.executable``, so no Jupyter kernel needs to be installed
on the machine and the kernel sees the same environment (rocketmq_spark, pyspark) as the tests.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
KERNEL = "rocketmq-spark-test"


@pytest.fixture
def kernel_manager(tmp_path):
    kernels = tmp_path / "kernels"
    write_kernel_spec(kernels / KERNEL, overrides={
        "display_name": f"rocketmq-spark tests ({sys.executable})"})
    specs = KernelSpecManager(kernel_dirs=[str(kernels)])
    assert specs.get_kernel_spec(KERNEL).argv[0] == sys.executable
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"clear the outputs of cells {dirty} before committing"


def test_quickstart_notebook_runs_clean(kernel_manager):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, km=kernel_manager, kernel_name=KERNEL, timeout=180, startup_timeout=60,
        allow_errors=False, resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    started = time.monotonic()
    try:
        client.execute()
    except CellExecutionError as exc:  # names the cell, with its traceback
        pytest.fail(f"a notebook cell failed:\n{exc}", pytrace=False)
    elapsed = time.monotonic() - started

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every code cell ran"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in code for o in c.outputs
                   if o.output_type == "stream")
    assert "run 2 read 400 rows" in text and text.rstrip().endswith("stopped")
    assert elapsed < 150, f"the notebook took {elapsed:.0f} s"
