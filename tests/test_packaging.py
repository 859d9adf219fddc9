"""What a user gets from ``pip install tidegate``: the license, the metadata an index page
shows, and the package data the code reads.

The project's metadata is read from pyproject.toml, the one place it is written.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

import tidegate
from tests.conftest import ROOT

PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT: dict[str, Any] = PYPROJECT["project"]
SOURCE = Path(tidegate.__file__).parent

APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""The SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte."""


def test_the_license_is_the_apache_2_text_named_by_its_spdx_expression() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    # PEP 639: with a license expression, no "License ::" classifier may be given.
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_the_classifiers_agree_with_the_project() -> None:
    classifiers = PROJECT["classifiers"]
    # The oldest Python classified is the oldest requires-python lets install.
    assert PROJECT["requires-python"] == ">=3.11"
    versions = sorted(
        tuple(map(int, c.rsplit(" ", 1)[1].split(".")))
        for c in classifiers
        if c.startswith("Programming Language :: Python :: 3.")
    )
    assert versions[0] == (3, 11)
    assert versions == [(3, minor) for minor in range(11, 11 + len(versions))]
    # Typed: the marker ships with the package.
    assert "Typing :: Typed" in classifiers
    assert (SOURCE / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["tidegate"]
    assert {"Framework :: FastAPI", "Framework :: AsyncIO"} <= set(classifiers)
    assert PROJECT["authors"] == [{"name": "tidegate contributors"}]
    assert PROJECT["keywords"]
