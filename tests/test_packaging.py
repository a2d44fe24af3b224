"""Installing the package as users and ci/setup.sh do: the editable install and the wheel.

``format("rocketmq")`` resolves only if PySpark's data source lookup, which lists top-level
modules with ``pkgutil.iter_modules()`` (sys.path entries, not import hooks), sees
``pyspark_rocketmq``. Each test installs a copy of the checkout into a fresh venv.
"""
from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIND = ("import pkgutil, sys; "
        "print(sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')))")


def _copy_checkout(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return dest


def _venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


def _pip(python: Path, *args: str, cwd: Path) -> str:
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps",
                           "--disable-pip-version-check", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


@pytest.mark.timeout(900)
def test_editable_install_as_setup_sh_does_it_is_found_without_warnings(tmp_path):
    script = (ROOT / "ci" / "setup.sh").read_text()
    assert "editable_mode" not in script, "ci/setup.sh must use the default editable mode"
    project = _copy_checkout(tmp_path / "project")
    python = _venv(tmp_path / "venv")
    output = _pip(python, "-e", ".", cwd=project)
    assert "compat" not in output.lower() and "transitional" not in output.lower(), output
    found = subprocess.run([str(python), "-c", FIND], cwd=tmp_path, capture_output=True,
                           text=True, check=True).stdout
    assert found.strip() == "['pyspark_rocketmq']"


@pytest.mark.timeout(900)
def test_wheel_holds_the_discovery_module_and_no_tests(tmp_path):
    project = _copy_checkout(tmp_path / "project")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--disable-pip-version-check", "-w", str(tmp_path / "dist"), "."],
                          cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    wheel = next((tmp_path / "dist").glob("rocketmq_spark-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_rocketmq.py" in names
    for package in ("client", "embedded"):  # the two C accelerators (setup.py)
        assert any(n.startswith(f"rocketmq_spark/{package}/_native") and n.endswith(".so")
                   for n in names), package
    assert not [n for n in names if n.startswith(("tests/", "ci/", "notebooks/"))]
    python = _venv(tmp_path / "venv")
    _pip(python, str(wheel), cwd=tmp_path)
    found = subprocess.run([str(python), "-c", FIND], cwd=tmp_path, capture_output=True,
                           text=True, check=True).stdout
    assert found.strip() == "['pyspark_rocketmq']"
