"""Executing the notebooks in notebooks/ with this interpreter as their kernel.

A kernelspec written to a temporary directory points at ``sys.executable``, so no Jupyter
kernel needs to be installed and the kernel sees the same environment (rocketmq_spark, pyspark,
matplotlib) as the caller. Used by tests/test_notebook.py and ci/run_notebooks.py.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "rocketmq-spark-notebooks"


def execute(path: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` (in its own folder); returns it with its
    outputs. Raises nbclient's CellExecutionError naming the failing cell."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="rmq-kernels-") as kernels:
        write_kernel_spec(Path(kernels) / KERNEL, overrides={
            "display_name": "Python 3 (rocketmq-spark)"})
        specs = KernelSpecManager(kernel_dirs=[kernels])
        manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
        NotebookClient(nb, km=manager, kernel_name=KERNEL, timeout=timeout, startup_timeout=90,
                       allow_errors=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    # Committed notebooks name a kernel every Jupyter has, not the temporary one.
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def code_outputs(nb: nbformat.NotebookNode, kind: str) -> list:
    """Every output of ``kind`` ("stream", "error", "display_data", ...) of its code cells."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == kind]


def images(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]


def stream_text(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in code_outputs(nb, "stream"))


if __name__ == "__main__":  # pragma: no cover - see ci/run_notebooks.py
    sys.exit("use ci/run_notebooks.py")
