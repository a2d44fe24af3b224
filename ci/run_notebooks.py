#!/usr/bin/env python
"""Execute the notebooks and save them with their outputs (the committed form).

    .venv/bin/python ci/run_notebooks.py                # every notebook in notebooks/
    .venv/bin/python ci/run_notebooks.py backfill       # just notebooks/backfill.ipynb

The notebooks are committed executed, so readers see the results and plots without running
them; CI executes them again (tests/test_notebook.py) and fails when a cell errors.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from notebook_runner import NOTEBOOKS, execute  # noqa: E402


def main(names) -> None:
    paths = [NOTEBOOKS / f"{n.removesuffix('.ipynb')}.ipynb" for n in names] or \
        sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        started = time.monotonic()
        nb = execute(path)
        nbformat.write(nb, path)
        print(f"{path.name}: executed and saved in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
