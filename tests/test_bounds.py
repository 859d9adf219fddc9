"""Each field's range is declared once (``tidegate.limits``) and every boundary holds it.

The admin API's models, the CLI's options and the library's checks are built from the
declaration; the tests here prove that each of them takes both ends of every range and
refuses what lies just past them. The database's CHECK constraints cannot import Python:
they are read back from a migrated schema's catalogs and compared with the declaration,
so that a change on either side alone fails here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

import click
import psycopg
import pytest
from pydantic import BaseModel, ValidationError

from tidegate import Settings, Tidegate
from tidegate.api.admin import KeyPolicy, ProjectLimits, ScheduleFields, TriggerFields
from tidegate.api.workers import TaskDeclaration
from tidegate.cli import main
from tidegate.errors import ConfigError, InputError
from tidegate.limits import (
    ATTEMPTS,
    MAX_SLOTS,
    POLICY_BOUNDS,
    PRIORITY,
    PROJECT_BOUNDS,
    SCHEDULE_BOUNDS,
    SETTING_BOUNDS,
    TASK_BOUNDS,
    TRIGGER_BOUNDS,
    Bound,
    Bounds,
)
from tidegate.policies import set_key_policy
from tidegate.projects import create_project, update_trigger
from tidegate.schedules import new_schedule
from tidegate.tasks import TaskSettings

TABLES: dict[str, Bounds] = {
    "projects": PROJECT_BOUNDS,
    "triggers": TRIGGER_BOUNDS,
    "key_policies": POLICY_BOUNDS,
    "schedules": SCHEDULE_BOUNDS,
    "tasks": TASK_BOUNDS,
}
"""The tables whose numeric columns are declared, each with its declaration."""

MODELS: list[tuple[type[BaseModel], Bounds]] = [
    (ProjectLimits, PROJECT_BOUNDS),
    (TriggerFields, TRIGGER_BOUNDS),
    (KeyPolicy, POLICY_BOUNDS),
    (ScheduleFields, SCHEDULE_BOUNDS),
    (TaskDeclaration, TASK_BOUNDS),
]
REQUIRED: dict[type[BaseModel], dict[str, Any]] = {TaskDeclaration: {"name": "echo"}}
"""What a model needs besides the number under test."""

COMMANDS: list[tuple[tuple[str, ...], Bounds, bool]] = [
    (("projects", "create"), PROJECT_BOUNDS, True),
    (("projects", "update"), PROJECT_BOUNDS, True),
    (("triggers", "create"), TRIGGER_BOUNDS, False),
    (("triggers", "update"), TRIGGER_BOUNDS, False),
    (("keys", "set"), POLICY_BOUNDS, True),
    (  # --every sets interval_seconds
        ("schedules", "create"),
        {
            **{k: v for k, v in SCHEDULE_BOUNDS.items() if k != "interval_seconds"},
            "every": SCHEDULE_BOUNDS["interval_seconds"],
        },
        True,
    ),
    (("enqueue",), {"priority": PRIORITY, "max_attempts": ATTEMPTS}, True),
    (("serve",), SETTING_BOUNDS, False),
    (("worker",), SETTING_BOUNDS, False),
]
"""Each command with numeric options, the declaration they follow, and whether it has an
option for every field of it."""

LIBRARY: dict[str, Callable[[str, Any], Any]] = {
    "projects": lambda name, value: next(create_project("acme", **{name: value})),
    "triggers": lambda name, value: next(update_trigger(1, **{name: value})),
    "key_policies": lambda name, value: next(set_key_policy("default", "k", **{name: value})),
    "schedules": lambda name, value: new_schedule(
        "acme", "nightly", "echo", **{"interval_seconds": 60.0, name: value}
    ),
    "tasks": lambda name, value: TaskSettings(
        **{"name": "echo", "lane": "default", "max_attempts": None, "timeout_seconds": None}
        | {"priority": 0, name: value}
    ).checked(),
}
"""A library call per table that checks one field before it writes anything."""


def ends(bound: Bound) -> list[float]:
    """Values the bound takes: its ends (the lowest past ``low`` when ``above``)."""
    if bound.above:
        return [math.nextafter(bound.low, math.inf), bound.high]
    return [bound.low, bound.high]


def past(bound: Bound) -> list[float]:
    """Values just outside the bound, and one that is not a whole number when it must be."""
    if bound.whole:
        return [bound.low - 1, bound.high + 1, bound.low + 0.5]
    low = bound.low if bound.above else math.nextafter(bound.low, -math.inf)
    return [low, math.nextafter(bound.high, math.inf), math.nan, math.inf]


def declared() -> Iterator[tuple[str, str, Bound]]:
    for table, bounds in TABLES.items():
        for name, bound in bounds.items():
            yield table, name, bound


def test_every_number_among_the_settings_has_a_declared_range() -> None:
    numbers = {
        f.name for f in fields(Settings) if f.init and f.type in ("int", "float", int, float)
    }
    assert numbers == set(SETTING_BOUNDS)


@pytest.mark.parametrize(("name", "bound"), sorted(SETTING_BOUNDS.items()))
def test_each_setting_holds_its_declared_range(name: str, bound: Bound) -> None:
    for value in ends(bound):
        try:
            assert getattr(Settings(**{name: value}), name) == value
        except ConfigError as error:  # the range took it; the heartbeat's rule did not
            assert "must be shorter than lease_seconds" in str(error)
    for value in past(bound):
        with pytest.raises(ConfigError, match=name):
            Settings(**{name: value})


@pytest.mark.parametrize(("model", "bounds"), MODELS, ids=lambda m: getattr(m, "__name__", ""))
def test_each_admin_model_holds_the_declared_ranges(model: type[BaseModel], bounds: Bounds) -> None:
    assert set(bounds) <= set(model.model_fields)
    required = REQUIRED.get(model, {})
    for name, bound in bounds.items():
        for value in ends(bound):
            assert getattr(model(**required, **{name: value}), name) == value
        for value in past(bound):
            with pytest.raises(ValidationError):
                model(**required, **{name: value})


@pytest.mark.parametrize(
    ("path", "bounds", "every"), COMMANDS, ids=lambda p: " ".join(p) if isinstance(p, tuple) else ""
)
def test_each_cli_option_holds_the_declared_range(
    path: tuple[str, ...], bounds: Bounds, every: bool
) -> None:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    options = {
        param.name: param.type
        for param in command.params
        if isinstance(param, click.Option) and param.name in bounds
    }
    if every:
        assert set(options) == set(bounds)
    assert options, path
    for name, kind in options.items():
        bound = bounds[name]
        assert isinstance(kind, click.IntRange if bound.whole else click.FloatRange), name
        assert (kind.min, kind.max) == (bound.low, bound.high), name
        assert (kind.min_open, kind.max_open) == (bound.above, False), name


@pytest.mark.parametrize(("table", "name", "bound"), list(declared()))
def test_the_library_holds_each_declared_range(table: str, name: str, bound: Bound) -> None:
    check = LIBRARY[table]
    for value in past(bound):
        with pytest.raises(InputError, match=name):
            check(name, value)


def column_ranges(conn: psycopg.Connection, schema: str) -> dict[tuple[str, str], Any]:
    """Every numeric column of ``TABLES`` with the range its type and CHECKs allow:
    ``(low, low_open, high, high_open)``, and whether a CHECK bounds it at all."""
    rows = conn.execute(
        """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
               coalesce(array_agg(pg_get_constraintdef(k.oid))
                        FILTER (WHERE k.oid IS NOT NULL), '{}')
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_constraint k
          ON k.conrelid = c.oid AND k.contype = 'c' AND k.conkey = ARRAY[a.attnum]
        WHERE c.relnamespace = %(schema)s::regnamespace AND c.relname = ANY(%(tables)s)
          AND format_type(a.atttypid, a.atttypmod)
              IN ('smallint', 'integer', 'bigint', 'double precision')
        GROUP BY 1, 2, 3
        """,
        {"schema": schema, "tables": list(TABLES)},
    ).fetchall()
    return {
        (table, column): sql_range(column, kind, checks) for table, column, kind, checks in rows
    }


TYPE_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
    "double precision": (-math.inf, math.inf),
}
COMPARISON = re.compile(r"\((\w+) (>=|>|<=|<) \(?(-?[0-9.]+)\)?(?:::[a-z ]+)?\)")


def sql_range(column: str, kind: str, checks: list[str]) -> tuple[Any, ...]:
    """The range of ``column`` (of type ``kind``) under its CHECKs: ``pg_get_constraintdef``
    writes ``BETWEEN a AND b`` as ``((c >= a) AND (c <= b))``."""
    low, high = TYPE_RANGES[kind]
    low_open = high_open = False
    checked = False
    whole = kind != "double precision"
    for check in checks:
        for name, operator, text in COMPARISON.findall(check):
            if name != column:
                continue
            checked = True
            value = float(text)
            if operator in (">=", ">") and value >= low:
                low, low_open = value, operator == ">"
            if operator in ("<=", "<") and value <= high:
                high, high_open = value, operator == "<"
    if whole:  # an integer over 0 is one from 1
        low, low_open = (low + 1 if low_open else low), False
        high, high_open = (high - 1 if high_open else high), False
    return float(low), low_open, float(high), high_open, checked


def expected(bound: Bound) -> tuple[Any, ...]:
    low, above = float(bound.low), bound.above
    if bound.whole and above:
        low, above = low + 1, False
    return low, above, float(bound.high), False, True


@pytest.mark.db
def test_every_check_constraint_agrees_with_its_declared_range(app: Tidegate) -> None:
    with app.database.connect() as conn:
        ranges = column_ranges(conn, app.settings.schema)
    disagree = {
        f"{table}.{name}": (ranges.get((table, name)), expected(bound))
        for table, name, bound in declared()
        if ranges.get((table, name), ())[:4] != expected(bound)[:4]
    }
    assert not disagree, "(database, declared) ranges differ"
    undeclared = sorted(
        f"{table}.{column}"
        for (table, column), found in ranges.items()
        if found[4] and column not in TABLES[table]
    )
    assert not undeclared, "CHECKs of ranges that tidegate.limits does not declare"


@pytest.mark.db
def test_the_workers_table_holds_a_workloops_declared_slots(app: Tidegate) -> None:
    with app.database.connect() as conn:
        (check,) = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'workers_slots_bounded' AND connamespace = %s::regnamespace",
            [app.settings.schema],
        ).fetchone() or (None,)
    assert isinstance(check, str)
    refused = re.findall(r'@\."slots" ([<>]) ([0-9]+)', check)
    assert sorted(refused) == [("<", "1"), (">", str(MAX_SLOTS))]
