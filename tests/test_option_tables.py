"""The README's option tables against the option tables the code parses with
(:data:`rocketmq_spark.source.options.SOURCE_OPTIONS`,
:data:`rocketmq_spark.sink.options.SINK_OPTIONS`): every option of the code is in the README
with the same default, and every option the README lists exists in the code.

The README's tables are markdown tables whose header is ``| option | default | meaning |``;
those under the "Writing" section are the sink's, the others the source's. A row may name
several options (``a`` / ``b``) with one default each (``x`` / ``y``) or one for all; a row
ending in ``...`` only points to another table.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from rocketmq_spark.options import OptionTable
from rocketmq_spark.sink.options import SINK_OPTIONS, SinkOptions
from rocketmq_spark.source.options import SOURCE_OPTIONS, SourceOptions

README = Path(__file__).resolve().parent.parent / "README.md"
HEADER = re.compile(r"^\|\s*option\s*\|\s*default\s*\|\s*meaning\s*\|$")


def normalized(text: str) -> str:
    """A default cell without markdown: backticks, parentheses and spacing do not count."""
    return re.sub(r"\s+", " ", text.replace("`", "").replace("(", "").replace(")", "")).strip()


def cells(line: str) -> List[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def readme_defaults() -> Dict[str, Dict[str, str]]:
    """{"source"|"sink": {option: default as the README shows it}}."""
    out: Dict[str, Dict[str, str]] = {"source": {}, "sink": {}}
    section, in_table = "", False
    for line in README.read_text().splitlines():
        if line.startswith("## "):
            section = line
        if HEADER.match(line.strip()):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if not in_table or line.startswith("|---"):
            continue
        names_cell, default_cell = cells(line)[:2]
        if "..." in names_cell:
            continue
        side = "sink" if "Writing" in section else "source"
        for name, default in row_options(names_cell, default_cell):
            assert name not in out[side], f"README lists {name} twice for the {side}"
            out[side][name] = default
    return out


def row_options(names_cell: str, default_cell: str) -> List[Tuple[str, str]]:
    names = re.findall(r"`([A-Za-z]+)`", names_cell)
    defaults = [d.strip() for d in default_cell.split(" / ")]
    if len(defaults) != len(names):
        defaults = [default_cell] * len(names)
    return [(n, normalized(d)) for n, d in zip(names, defaults)]


@pytest.fixture(scope="module")
def documented() -> Dict[str, Dict[str, str]]:
    return readme_defaults()


@pytest.mark.parametrize("side, table", [("source", SOURCE_OPTIONS), ("sink", SINK_OPTIONS)])
def test_every_option_is_in_the_readme_with_its_default(documented, side, table: OptionTable):
    for option in table.options:
        assert option.name in documented[side], \
            f"the README's {side} options do not list {option.name}"
        assert documented[side][option.name] == normalized(option.default_text), \
            f"{option.name}: the README says {documented[side][option.name]!r}, the code " \
            f"{option.default_text!r}"


@pytest.mark.parametrize("side, table", [("source", SOURCE_OPTIONS), ("sink", SINK_OPTIONS)])
def test_every_option_in_the_readme_exists(documented, side, table: OptionTable):
    known = {o.name for o in table.options}
    assert documented[side], f"no {side} option table found in the README"
    assert set(documented[side]) <= known, set(documented[side]) - known


@pytest.mark.parametrize("options_class, table", [(SourceOptions, SOURCE_OPTIONS),
                                                  (SinkOptions, SINK_OPTIONS)])
def test_the_parsed_options_default_as_the_table_says(options_class, table: OptionTable):
    """The dataclasses' own defaults agree with the table's (parsing starts from the table)."""
    fields = options_class.__dataclass_fields__
    for option in table.options:
        declared = fields[option.field].default if option.field else dataclasses.MISSING
        if declared is not dataclasses.MISSING and option.default is not None:
            assert declared == option.default, option.name


def test_every_option_has_one_line_of_doc():
    for option in SOURCE_OPTIONS.options + SINK_OPTIONS.options:
        assert option.doc and "\n" not in option.doc, option.name
