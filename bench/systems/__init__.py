"""The systems the benchmark compares, and the environment each one runs in.

Each has a module here with an ``ADAPTER`` (see ``base.py``). tidegate and the raw-SQL
queue run on tidegate's own interpreter and environment; every peer is installed from
PyPI into a virtual environment of its own under ``.bench/venvs`` (``bench/envs.py``),
never into tidegate's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class System:
    name: str
    title: str
    python: str | None = None
    """The interpreter its environment needs (``"3.12"``); ``None``: tidegate's own."""
    requirements: tuple[str, ...] = ()
    """What its environment installs from PyPI; empty: it runs in tidegate's environment."""


DRIVER = ("psycopg[binary]>=3.2",)
"""What the driver itself needs in every peer's environment (verification, timing)."""

SYSTEMS: dict[str, System] = {
    system.name: system
    for system in (
        System("tidegate", "tidegate"),
        System("raw", "raw SQL"),
        System(
            "pgqueuer",
            "pgqueuer",
            requirements=("pgqueuer[asyncpg]==1.6.0", "asyncpg==0.32.0"),
        ),
        System("procrastinate", "procrastinate", requirements=("procrastinate==3.10.0",)),
        System("oban", "oban", python="3.12", requirements=("oban==0.7.0",)),
        System("awa", "awa", requirements=("awa-pg==0.6.9",)),
    )
}
