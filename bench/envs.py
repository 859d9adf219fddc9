"""The benchmark's own virtual environments: one per peer, made and kept up to date here.

``python -m bench.envs [SYSTEM ...]`` makes them ahead of a run; ``bench/run.py`` makes
any that are missing. Each lives in ``.bench/venvs/<system>``, made with the
interpreter the system needs, and holds the system's pinned release from PyPI, the
driver's own needs (``bench.systems.DRIVER``) and nothing of tidegate. A stamp of what
was asked for makes a changed pin rebuild the environment. A system that cannot be
installed is reported with the reason, never dropped silently.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness import ROOT
from bench.systems import DRIVER, SYSTEMS, System

VENVS = ROOT / ".bench" / "venvs"


@dataclass(frozen=True)
class Environment:
    """Where a system runs: its interpreter, or why it cannot run here."""

    system: str
    python: str | None
    reason: str = ""
    versions: tuple[tuple[str, str], ...] = ()


def interpreter(version: str | None) -> str | None:
    """Return a path to a Python of ``version`` (``"3.12"``), or ``None`` if none is here.

    ``python3.12`` on the PATH first, then pyenv's versions, whose shims refuse a
    version that is installed but not selected; each candidate must really run.
    """
    if version is None or f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")), reverse=True)
    for candidate in filter(None, candidates):
        if _run([candidate, "-c", "import venv"]).returncode == 0:
            return candidate
    return None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def ensure(system: System) -> Environment:
    """Make (or reuse) the environment of ``system``; return its interpreter or the reason."""
    if not system.requirements:
        return Environment(system.name, sys.executable)
    base = interpreter(system.python)
    if base is None:
        return Environment(system.name, None, f"no Python {system.python} on this machine")
    venv = VENVS / system.name
    python = venv / "bin" / "python"
    stamp = venv / "bench-requirements.json"
    wanted = json.dumps({"python": system.python, "requirements": [*system.requirements, *DRIVER]})
    if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
        shutil.rmtree(venv, ignore_errors=True)
        made = _run([base, "-m", "venv", str(venv)])
        if made.returncode != 0:
            return Environment(system.name, None, f"venv failed: {made.stderr.strip()[-300:]}")
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        installed = _run([*pip, *system.requirements, *DRIVER])
        if installed.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = installed.stderr.strip().splitlines()[-3:]
            return Environment(system.name, None, "pip install failed: " + " | ".join(tail))
        stamp.write_text(wanted)
    return Environment(system.name, str(python), versions=versions(str(python), system))


def versions(python: str, system: System) -> tuple[tuple[str, str], ...]:
    """Return the installed version of each requirement and of the interpreter."""
    names = [r.split("==")[0].split("[")[0].split(">")[0] for r in (*system.requirements, *DRIVER)]
    script = (
        "import importlib.metadata as m, json, platform, sys; "
        "print(json.dumps([['python', platform.python_version()]] + "
        "[[n, m.version(n)] for n in sys.argv[1:]]))"
    )
    found = _run([python, "-c", script, *names])
    if found.returncode != 0:
        return ()
    return tuple((name, version) for name, version in json.loads(found.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.envs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("systems", nargs="*", help="default: every peer")
    args = parser.parse_args(argv)
    names = args.systems or [s.name for s in SYSTEMS.values() if s.requirements]
    failed = 0
    for name in names:
        env = ensure(SYSTEMS[name])
        if env.python is None:
            failed += 1
            print(f"{name}: NOT INSTALLED: {env.reason}")
        else:
            print(f"{name}: {env.python} " + " ".join(f"{n}=={v}" for n, v in env.versions))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
