"""Task settings known to every process: the ``tasks`` table.

A task's lane, priority, max_attempts and timeout are written in the code of the app
that has it (``@app.task(lane="reports", max_attempts=1)``). Only the processes that
import that code know them; a run enqueued by task name elsewhere (``tidegate
enqueue``, ``POST /runs``, a webhook trigger, another service's ``app.enqueue("name")``)
would get the defaults instead. So every worker declares its tasks' settings in the
database when it starts (``declare_tasks``; a remote worker through the API when it
registers), and an enqueue by name reads them (``find_tasks``, or ``admit_webhook`` in
its own statement). A value the enqueue gives wins; a task no worker ever declared
keeps the defaults.

Two workers that declare one task differently (a rolling deploy): the last to start
wins, and it logs a warning naming both workers and both settings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from tidegate.limits import TASK_BOUNDS, check_lane, check_numbers, check_text
from tidegate.storage.sql import Statement, Steps

log = logging.getLogger("tidegate")

MAX_LISTED = 1000
"""The most tasks one page of ``list_tasks`` holds."""


@dataclass(frozen=True)
class TaskSettings:
    """A task's settings as a worker declared them (a row of the ``tasks`` table)."""

    name: str
    lane: str
    max_attempts: int | None
    """``None``: the enqueuer's default (``TIDEGATE_MAX_ATTEMPTS``)."""
    timeout_seconds: float | None
    """``None``: no limit. The worker that runs an attempt applies its own task's."""
    priority: int
    key_function: str | None = None
    """The name of the function that computes a run's key from its args: code only the
    worker's app has, so a run enqueued by name elsewhere gets its project's key."""
    declared_by: str | None = None
    """The worker that declared them last."""
    updated_at: datetime | None = None

    def checked(self) -> TaskSettings:
        """Return the settings, or raise ``InputError`` naming the value out of bounds
        (``tidegate.limits.TASK_BOUNDS``; the CHECKs ``tasks_*``)."""
        check_text(self.name, "task name")
        check_lane(self.lane)
        numbers = {
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
            "priority": self.priority,
        }
        check_numbers(numbers, TASK_BOUNDS)
        if self.key_function is not None:
            check_text(self.key_function, "key function")
        return self

    def declaration(self) -> dict[str, Any]:
        """What a worker declares: the settings without who declared them and when (the
        rows ``declare_tasks`` writes, the tasks a remote worker registers)."""
        return {
            "name": self.name,
            "lane": self.lane,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
            "priority": self.priority,
            "key_function": self.key_function,
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["updated_at"] = None if self.updated_at is None else self.updated_at.isoformat()
        return data

    def shown(self) -> str:
        """The settings in one line, for a log."""
        return (
            f"lane={self.lane} priority={self.priority} max_attempts={self.max_attempts} "
            f"timeout_seconds={self.timeout_seconds} key_function={self.key_function}"
        )


def declare_tasks(declared: Sequence[TaskSettings], declared_by: str) -> Steps[list[TaskSettings]]:
    """Write the settings of a worker's tasks (``declared_by``: the worker's id); return
    the settings they replaced that differed, each logged as a warning."""
    if not declared:
        return []
    tasks = [t.declaration() for t in declared]
    params = {"tasks": json.dumps(tasks), "declared_by": declared_by}
    rows = yield Statement("declare_tasks", params, dict_row)
    replaced = [TaskSettings(**row) for row in rows]
    by_name = {t.name: t for t in declared}
    for old in replaced:
        log.warning(
            "task %r: worker %s declares %s, replacing what worker %s declared at %s (%s); "
            "runs enqueued by name now take the new settings",
            old.name,
            declared_by,
            by_name[old.name].shown(),
            old.declared_by,
            old.updated_at.isoformat() if old.updated_at else "?",
            old.shown(),
            extra={"task": old.name},
        )
    return replaced


def find_tasks(names: Sequence[str]) -> Steps[dict[str, TaskSettings]]:
    """The declared settings of the tasks ``names``, by name (a task never declared is
    missing)."""
    rows = yield Statement("find_tasks", {"names": sorted(set(names))}, dict_row)
    return {row["name"]: TaskSettings(**row) for row in rows}


def list_tasks(limit: int = MAX_LISTED, *, after: str | None = None) -> Steps[list[TaskSettings]]:
    """The declared tasks in name order, after the task named ``after``."""
    rows = yield Statement("list_tasks", {"after": after, "limit": limit}, dict_row)
    return [TaskSettings(**row) for row in rows]
