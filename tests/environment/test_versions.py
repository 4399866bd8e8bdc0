"""tpukit/environment/versions.py against setup.cfg: every range tpukit declares has both ends in a stack its tests
ran on (`TESTED_STACKS`), and the hosted runtimes and the TensorFlow TPU build's Pythons say what the extras do."""

import configparser
import re

import pytest
from helpers import REPO
from packaging.markers import Marker

from tpukit.environment import versions


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(f"{REPO}/setup.cfg")
    return parser


def _ends(specifier: str) -> tuple[str, str]:
    """'>=0.10,<0.13' -> ('0.10', '0.12'): the lowest and the highest minor a range admits."""
    low = re.search(r">=\s*(\d+)\.(\d+)", specifier)
    high = re.search(r"<\s*(\d+)\.(\d+)", specifier)
    return f"{low[1]}.{low[2]}", f"{high[1]}.{int(high[2]) - 1}"


@pytest.mark.parametrize(
    "name, section, key",
    [
        ("jax", "options.extras_require", "jax"),
        ("tensorflow", "options.extras_require", "tensorflow"),
        ("keras", "options", "install_requires"),
    ],
)
def test_every_declared_range_ran_at_both_ends(name, section, key):
    text = _setup_cfg()[section][key]
    specifier = re.search(rf"^\s*{name}\s*(>=[^;\n]+)", text, re.M)[1]
    stacks = " | ".join(stack.packages for stack in versions.TESTED_STACKS)
    for end in _ends(specifier):
        assert re.search(rf"\b{name}(-cpu)? {re.escape(end)}\.", stacks), (
            f"setup.cfg admits {name} {end} ({specifier.strip()}), which no tested stack ran"
        )


def test_the_oldest_python_admitted_is_a_tested_one_and_so_is_colabs():
    floor = re.search(r">=\s*(\d+\.\d+)", _setup_cfg()["options"]["python_requires"])[1]
    pythons = {stack.python for stack in versions.TESTED_STACKS}
    assert floor in pythons
    assert versions.HOSTED_RUNTIMES["colab"].python in pythons


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_the_tpu_extra_adds_tensorflows_tpu_build_exactly_where_it_has_a_wheel(python):
    lines = [
        line.strip() for line in _setup_cfg()["options.extras_require"]["tpu"].splitlines() if line
    ]
    installs = [
        line.split(";")[0]
        for line in lines
        if ";" not in line or Marker(line.split(";", 1)[1]).evaluate({"python_version": python})
    ]
    installable = versions.tensorflow_tpu_installable(tuple(map(int, python.split("."))))
    pinned = versions.pinned_tpu()
    expected = (
        [f"tensorflow-tpu=={pinned.tensorflow}", f"libtpu=={pinned.libtpu}"] if installable else []
    )
    assert installs == expected
    if not installable:
        why = versions.no_tensorflow_tpu_wheel((3, 13))
        assert "Python 3.13" in why and "CPython 3.10-3.12 only" in why
        assert f'pip install "tpukit[jax-tpu] @ {versions.SOURCE}"' in why
