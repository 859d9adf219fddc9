"""What a user gets from ``pip install tidegate``: the license, the metadata an index page
shows, the dependencies the code imports, and the package data the code reads.

The project's metadata is read from pyproject.toml, the one place it is written.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

import tidegate
from tests.conftest import ROOT
from tests.test_serve import Serve
from tidegate.api.protocol import GuardedHttpToolsProtocol
from tidegate.storage.migrate import latest_version

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


def test_the_version_is_written_once_in_the_package() -> None:
    """pyproject.toml reads ``tidegate.__version__``; the installed metadata, ``tidegate
    --version`` and the API's OpenAPI document say the same (tests/test_cli.py and the
    wheel's test below)."""
    assert "version" not in PROJECT
    assert "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tidegate.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", tidegate.__version__)
    assert tidegate.__version__ == importlib.metadata.version("tidegate")
    written = [
        str(path.relative_to(SOURCE))
        for path in SOURCE.rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".html", ".js", ".sql"}
        and path.name != "__init__.py"
        and f'"{tidegate.__version__}"' in path.read_text()
    ]
    assert written == []


# -- dependencies: what the code imports, pyproject declares -----------------------------


def catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = ast.unparse(handler.type) if handler.type is not None else ""
    return "ImportError" in caught or "ModuleNotFoundError" in caught


def imports(tree: ast.Module) -> Iterator[tuple[str, bool]]:
    """Each absolute import's top-level module, and whether it is optional: inside a
    ``try`` that catches ``ImportError`` (the code runs without it)."""
    optional: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(map(catches_import_error, node.handlers)):
            optional.update(inner for statement in node.body for inner in ast.walk(statement))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.partition(".")[0], node in optional
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.partition(".")[0], node in optional


def third_party_imports() -> dict[str, bool]:
    """Every third-party top-level module imported under src/tidegate, at the top of a
    module, in a function or for type checking alike; True where every import of it is
    optional."""
    found: dict[str, bool] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for module, optional in imports(ast.parse(path.read_text(), str(path))):
            if module in sys.stdlib_module_names or module in ("__future__", "tidegate"):
                continue
            found[module] = found.get(module, True) and optional
    return found


def requirements(extra: str | None = None) -> list[Requirement]:
    texts = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def names(found: list[Requirement]) -> set[str]:
    return {canonicalize_name(requirement.name) for requirement in found}


def through_extras(found: list[Requirement]) -> set[str]:
    """The distributions the extras of ``found`` add (``uvicorn[standard]``: uvloop, ...),
    as the installed distributions declare them."""
    added = set()
    for requirement in found:
        for extra in requirement.extras:
            for text in importlib.metadata.requires(requirement.name) or []:
                pulled = Requirement(text)
                if pulled.marker is not None and pulled.marker.evaluate({"extra": extra}):
                    added.add(canonicalize_name(pulled.name))
    return added


def test_every_third_party_module_the_code_imports_is_a_declared_dependency() -> None:
    """An import that only works because another dependency happens to pull its package
    in breaks the day that one stops. Imports the code can do without (``try: ...
    except ImportError``) may come from an extra of tidegate's or of a dependency."""
    found = third_party_imports()
    assert {"fastapi", "pydantic", "starlette", "uvicorn", "psycopg"} <= set(found)
    declared = names(requirements())
    extras = set().union(*(names(requirements(e)) for e in PROJECT["optional-dependencies"]))
    may_be_missing = declared | extras | through_extras(requirements())
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module, optional in sorted(found.items()):
        provided = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert provided, f"{module} is imported but no installed distribution provides it"
        if not provided & (may_be_missing if optional else declared):
            undeclared[module] = sorted(provided)
    assert undeclared == {}, "imported but not declared in pyproject.toml's dependencies"


def test_no_module_imports_a_private_module_of_a_dependency() -> None:
    """``psycopg._cursor_base`` and the like can change in any release."""
    private = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            private += [
                f"{path.relative_to(SOURCE)}: {module}"
                for module in modules
                if not module.startswith("tidegate")
                and any(part.startswith("_") for part in module.split(".")[1:])
            ]
    assert private == []


def test_uvicorn_is_held_below_a_release_that_may_change_what_the_protocol_overrides() -> None:
    """tidegate.api.protocol overrides methods of uvicorn's ``HttpToolsProtocol``, which
    is not uvicorn's public API: a method renamed upstream would leave its override
    silently unused, so each must still be uvicorn's, and the installed uvicorn within
    the bound pyproject.toml holds it to."""
    [uvicorn] = [r for r in requirements() if r.name == "uvicorn"]
    assert any(spec.operator == "<" for spec in uvicorn.specifier), uvicorn
    assert importlib.metadata.version("uvicorn") in uvicorn.specifier
    own = {"unread", "_arm", "_disarm", "_too_slow", "_refuse"}
    overridden = {
        name
        for name, value in vars(GuardedHttpToolsProtocol).items()
        if inspect.isfunction(value) and name not in own
    }
    assert {"data_received", "on_headers_complete", "_unsupported_upgrade_warning"} <= overridden
    missing = {name for name in overridden if not callable(getattr(HttpToolsProtocol, name, None))}
    assert missing == set()


def test_schedules_know_their_time_zones_on_a_system_without_a_time_zone_database() -> None:
    """With no system database (an empty TZPATH, as in a slim container), zoneinfo reads
    the tzdata package: "UTC" and "Europe/Berlin" are known, not refused."""
    check = (
        "import zoneinfo; from tidegate.schedules import Timing; "
        "assert zoneinfo.TZPATH == (), zoneinfo.TZPATH; "
        "Timing(interval_seconds=30); "
        "Timing(cron='0 8 * * MON', timezone='Europe/Berlin'); "
        "Timing(cron='@daily', timezone='UTC')"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        env={**os.environ, "PYTHONTZPATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


# -- the wheel: built, installed in a fresh virtual environment, serving ------------------

STEP_SECONDS = 120.0
"""The most one step may take: building or installing is seconds with pip's cache."""
README_TOKEN = "change-me"
"""The admin token of the README's first command."""


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    """Run ``command`` to its end; return its stdout."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_SECONDS,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(tmp_path: Path) -> Path:
    """Build the wheel with ``python -m build --wheel`` from a copy of the checkout, so
    that the build leaves nothing (build/, egg-info) in it."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignored)
    dist = tmp_path / "dist"
    command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)]
    run(*command, cwd=tmp_path, env=dict(os.environ))
    [wheel] = dist.glob("*.whl")
    return wheel


def package_files() -> set[str]:
    """What the wheel must carry of src/: every file of the package, the code, the SQL,
    the templates, the static files and the ``py.typed`` marker alike."""
    return {
        path.relative_to(SOURCE.parent).as_posix()
        for path in SOURCE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def required(metadata: str) -> set[str]:
    """The wheel's ``Requires-Dist`` outside any extra, each as a normalized requirement."""
    return {
        str(Requirement(line.removeprefix("Requires-Dist: ")))
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    }


def outside_the_checkout(venv: Path) -> dict[str, str]:
    """This environment without what points into the checkout or its virtualenv, with the
    fresh ``venv`` first on the PATH, as a shell with it activated has it."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("TIDEGATE_", "PYTHON")) and name != "VIRTUAL_ENV"
    }
    return {**kept, "PATH": f"{venv / 'bin'}{os.pathsep}{kept.get('PATH', '')}"}


@pytest.mark.wheel
def test_the_wheel_installs_in_a_fresh_environment_and_serves(tmp_path: Path) -> None:
    """``python -m build`` makes a wheel with the whole package in it; installed (not
    editable) in a new virtual environment, with its dependencies and nothing else, the
    README's first command serves from it on an embedded PostgreSQL: the API, the
    dashboard and its static files, and the schema made from the wheel's SQL, through
    which a run is claimed and done."""
    pytest.importorskip("build", reason="the build package is not installed (tidegate[test])")
    version = tidegate.__version__
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"tidegate-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        contents = set(archive.namelist())
        metadata = archive.read(f"tidegate-{version}.dist-info/METADATA").decode()
    assert {name for name in contents if name.startswith("tidegate/")} == package_files()
    assert f"tidegate-{version}.dist-info/licenses/LICENSE" in contents
    assert {"License-Expression: Apache-2.0", "License-File: LICENSE"} <= set(metadata.splitlines())
    assert required(metadata) == {str(r) for r in requirements()}

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path, env=dict(os.environ))
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    run(*pip, "install", "--quiet", wheel, cwd=tmp_path, env=dict(os.environ))
    run(*pip, "check", cwd=tmp_path, env=dict(os.environ))
    env = outside_the_checkout(venv)
    project = tmp_path / "project"
    project.mkdir()
    where = run("python", "-c", "import tidegate; print(tidegate.__file__)", cwd=project, env=env)
    assert Path(where.strip()).is_relative_to(venv), where
    assert run("tidegate", "--version", cwd=project, env=env) == f"tidegate {version}\n"

    serve = Serve(
        env={**env, "TIDEGATE_ADMIN_TOKEN": README_TOKEN},
        cwd=project,
        command=[str(venv / "bin" / "tidegate")],
    )
    try:
        with httpx.Client(base_url=serve.url, timeout=10) as client:
            serve.wait_for(r"INFO tidegate\.worker: worker \S+ started")
            assert client.get("/healthz").json() == {"status": "ok"}
            assert client.get("/openapi.json").json()["info"]["version"] == version
            assert client.get("/docs").status_code == 200

            login = client.get("/ui/login")
            assert login.status_code == 200
            static = re.findall(r'(?:href|src)="/ui/static/([^"]+)"', login.text)
            assert {"ui.css", "ui.js", "htmx.min.js"} <= set(static)
            for name in static:
                served = client.get(f"/ui/static/{name}")
                assert served.status_code == 200, name
                assert served.content == (SOURCE / "ui" / "static" / name).read_bytes(), name
            signed_in = client.post("/ui/login", data={"token": README_TOKEN})
            assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/ui/")
            assert client.get("/ui/").status_code == 200  # the overview, rendered

            # The schema serve made is the one this code needs; and a run is claimed,
            # done and read through the wheel's stored functions and statements.
            migrated = run("tidegate", "migrate", cwd=project, env=env)
            assert migrated == f"schema 'tidegate' at version {latest_version()} (up to date)\n"
            enqueued = run(
                "tidegate", "enqueue", "tidegate.echo", "--args", '{"n": 1}', cwd=project, env=env
            )
            path = f"/runs/{json.loads(enqueued)['id']}"
            admin = {"Authorization": f"Bearer {README_TOKEN}"}
            deadline = time.monotonic() + 30
            while (state := client.get(path, headers=admin).json()["state"]) != "succeeded":
                assert state in ("available", "running") and time.monotonic() < deadline, state
                time.sleep(0.1)
    finally:
        assert serve.stop() == 0, "\n".join(serve.lines)
