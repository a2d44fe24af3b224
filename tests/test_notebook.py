"""The notebooks, executed top to bottom (their cells assert their own results), and committed
as reports: with their outputs and plots (``ci/run_notebooks.py`` executes and saves them).

Each notebook runs in its own kernel process (it starts its own SparkSession, which cannot
share this process with the suite's); see tests/notebook_runner.py.
"""
from __future__ import annotations

import time

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from notebook_runner import NOTEBOOKS, code_outputs, execute, images, stream_text

# notebook -> (text its run must print, plots it must draw)
EXPECTED = {
    "quickstart": ("run 2 read 400 rows", 2),
    "backfill": ("minutes, each equal to what was produced", 1),
    "dead_letters": ("replayed 4 repaired messages; the pipeline processed them", 1),
}


def test_every_notebook_is_checked_here():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_notebook_is_an_executed_report(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "commit it executed (ci/run_notebooks.py)"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "executed top to bottom in one run"
    assert not code_outputs(nb, "error")
    text, plots = EXPECTED[name]
    assert text in stream_text(nb) and len(images(nb)) == plots


# CI runs the quick start and the dead-letters notebook; the backfill notebook runs with
# -m slow (CI's 20-minute budget); all are checked as committed reports above.
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "backfill" else n
                                  for n in sorted(EXPECTED)])
def test_notebook_runs_clean(name):
    started = time.monotonic()
    try:
        nb = execute(NOTEBOOKS / f"{name}.ipynb", timeout=180)
    except CellExecutionError as exc:  # names the cell, with its traceback
        pytest.fail(f"a cell of {name}.ipynb failed:\n{exc}", pytrace=False)
    elapsed = time.monotonic() - started
    assert not code_outputs(nb, "error")
    text, plots = EXPECTED[name]
    out = stream_text(nb)
    assert text in out and out.rstrip().endswith("stopped")
    assert len(images(nb)) == plots, "every plot was drawn"
    assert elapsed < 240, f"{name}.ipynb took {elapsed:.0f} s"
