"""Installing Kilolock is quiet: the project metadata uses the current forms, so setuptools prints no
deprecation warnings (the license is an SPDX expression, not a table)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_license_is_an_spdx_expression_with_a_setuptools_that_reads_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in project["project"].get("classifiers", []))
    assert "setuptools>=77" in project["build-system"]["requires"]


@pytest.mark.slow
def test_building_the_package_prints_no_deprecation_warning(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("app", "analyzer", "runner"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
                             "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "project.license" not in said and "SetuptoolsDeprecationWarning" not in said, said[-3000:]


def test_the_editable_install_of_dev_setup_is_a_plain_path_file_without_warnings(tmp_path):
    # What `./dev setup` (pip install -e) runs, called offline: setuptools' PEP 660 hook on a copy of the
    # project. With the packages at the root declared as such, it writes one .pth of the checkout instead of
    # a meta-path finder with its "folders with the same name as your package" warning.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("app", "analyzer", "runner"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    hook = ("import sys, setuptools.build_meta as b; "
            "print(b.build_editable(sys.argv[1]), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-W", "default", "-c", hook, str(tmp_path / "dist")], cwd=source,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr and "Please be careful" not in result.stderr, result.stderr[-3000:]
    import zipfile

    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "__editable__.kilolock-0.1.0.pth" in names
    assert not any("finder" in n for n in names)
