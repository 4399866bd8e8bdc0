"""setup.cfg lists packages by hand (tpukit.recipes is mapped onto recipes/), so a new folder under tpukit/ is
left out of the wheel unless it is added there: the wheel job of `.ci/run` then fails on `No module named ...`
after an hour of CI. This checks the list against the folders in a second."""

import configparser
import pathlib

from helpers import REPO

ROOT = pathlib.Path(REPO)


def _listed():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}


def test_every_package_folder_is_listed_in_setup_cfg():
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "tpukit").rglob("__init__.py")
    }
    missing = sorted(folders - _listed())
    assert not missing, f"add to setup.cfg [options] packages: {missing}"


def test_every_listed_package_exists():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    mapped = {
        line.split("=")[0].strip()
        for line in config["options"]["package_dir"].splitlines()
        if "=" in line
    }
    stale = sorted(
        name
        for name in _listed() - mapped
        if not (ROOT.joinpath(*name.split(".")) / "__init__.py").exists()
    )
    assert not stale, f"setup.cfg lists packages with no folder: {stale}"
