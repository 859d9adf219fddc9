"""The ``tidegate`` command.

Every option also reads from an environment variable, shown in ``--help``: a setting
from ``TIDEGATE_<OPTION>`` (``TIDEGATE_WORKLOOPS``), a command's own option from
``TIDEGATE_<COMMAND>_<OPTION>`` (``TIDEGATE_RUNS_LIMIT``, ``TIDEGATE_SCHEDULES_CREATE_EVERY``),
named after the option as it is typed (each option's parameter has the option's name,
since click names the variable after the parameter); an option given on the command line
wins. Where ``TIDEGATE_DATABASE_URL`` is unset, ``DATABASE_URL`` or libpq's ``PG*``
variables name the database (``tidegate.settings.conventional_database_url``). ``--help``
shows each option's default: the value the command uses, and every option has a help
text.

Expected failures (PostgreSQL unreachable or refusing the login, a schema to migrate, no
database found, a port in use) print one line, ``tidegate: <what, where, why>``, and exit
1; ``-v`` adds the traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import getpass
import importlib
import json
import logging
import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import IO, Any, TypeVar

import click
import psycopg

from tidegate import __version__
from tidegate.app import NewRun, Tidegate
from tidegate.errors import TidegateError
from tidegate.figures import ACTIVE_STATES, LaneFigures
from tidegate.limits import (
    ATTEMPTS,
    MAX_ID,
    MAX_TEXT_CHARS,
    POLICY_BOUNDS,
    PRIORITY,
    PROJECT_BOUNDS,
    SCHEDULE_BOUNDS,
    SETTING_BOUNDS,
    TRIGGER_BOUNDS,
    Bound,
)
from tidegate.logs import configure as configure_logging
from tidegate.runs import (
    MAX_BULK_RUNS,
    BulkAction,
    Run,
    RunState,
    args_filter,
    bulk_runs,
    list_runs,
    retry_runs,
    with_holds,
)
from tidegate.settings import (
    DATABASE_POOLERS,
    DEFAULT_DATA_DIR,
    ENV_PREFIX,
    LOG_FORMATS,
    Settings,
    conventional_database_url,
)
from tidegate.storage.database import Database, describe_database, describe_failure
from tidegate.storage.embedded import embedded_status, find_data_dir
from tidegate.storage.migrate import (
    check_schema,
    latest_version,
    read_schema_release,
    schema_version,
)
from tidegate.storage.sql import Steps
from tidegate.tasks import find_tasks, list_tasks
from tidegate.unique import DEFAULT_STATES

FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)
log = logging.getLogger("tidegate")

SERVE_WORKLOOPS = "fast_lane:2 manual>*:8"
"""The worker ``tidegate serve`` starts: two slots that only run sync webhooks' fast-lane
runs, so their callers never wait behind a backlog, and eight for everything else."""
DEMO_WORKLOOPS = "fast_lane:1 manual>*:8"
NO_DATABASE = (
    "no tidegate database here or in any parent folder; start one with tidegate serve, "
    "or set TIDEGATE_DATABASE_URL"
)
_SETTING_DEFAULTS = {f.name: f.default for f in fields(Settings) if f.init}


class Failure(click.ClickException):
    """An expected failure: printed as ``tidegate: <message>``, exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"tidegate: {self.format_message()}", file=file, err=True)


class CommandLine(click.Group):
    """The ``tidegate`` group: turns tidegate's and PostgreSQL's errors into one line.

    They are the expected failures (a server down, a wrong password, a schema to
    migrate), and a 40-line traceback hides the one line that says what to do. Handled
    here, for every command, rather than in each.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (TidegateError, psycopg.Error) as error:
            obj = ctx.obj or {}
            if obj.get("verbose"):
                traceback.print_exception(error)
            settings = obj.get("settings")
            if isinstance(error, psycopg.Error) and settings is not None:
                raise Failure(describe_failure(error, settings)) from None
            raise Failure((str(error).strip() or type(error).__name__).splitlines()[0]) from None


def bounded(bound: Bound) -> click.IntRange | click.FloatRange:
    """The click type of a number within ``bound`` (``tidegate.limits``): a value past it
    is a usage error naming the option and the range, before anything runs."""
    if bound.whole:
        return click.IntRange(int(bound.low), int(bound.high))
    return click.FloatRange(bound.low, bound.high, min_open=bound.above)


def _option(name: str, *decls: str, **kwargs: Any) -> Callable[[FC], FC]:
    """An option that also reads ``TIDEGATE_<NAME>``; a setting's default is ``Settings``',
    and its type holds the setting's bound (``SETTING_BOUNDS``).

    For settings and the global switches: the same variable configures the library, a
    worker and every command.
    """
    key = name.lstrip("-").replace("-", "_")
    if key in _SETTING_DEFAULTS:
        kwargs.setdefault("default", _SETTING_DEFAULTS[key])
    if key in SETTING_BOUNDS:
        kwargs.setdefault("type", bounded(SETTING_BOUNDS[key]))
    envvar = ENV_PREFIX + key.upper()
    return click.option(name, *decls, envvar=envvar, show_envvar=True, **kwargs)


def _command_option(*decls: str, **kwargs: Any) -> Callable[[FC], FC]:
    """An option of one command, read also from ``TIDEGATE_<COMMAND>_<NAME>``."""
    return click.option(*decls, show_envvar=True, **kwargs)


def _bounded_options(bounds: dict[str, Bound], helps: dict[str, str]) -> Callable[[FC], FC]:
    """An option per field of ``helps`` (``--fast-lane-cap`` for ``fast_lane_cap``), each
    holding the field's bound in ``bounds``, in the order given."""

    def add(function: FC) -> FC:
        for name, text in reversed(helps.items()):
            option = f"--{name.replace('_', '-')}"
            function = _command_option(option, type=bounded(bounds[name]), help=text)(function)
        return function

    return add


@click.group(
    cls=CommandLine,
    context_settings={"auto_envvar_prefix": "TIDEGATE", "show_default": True},
)
@_option(
    "--database-url",
    help="PostgreSQL URL. Unset: DATABASE_URL, else libpq's PG* variables if one names a "
    "server (PGHOST, PGHOSTADDR, PGPORT, PGDATABASE, PGSERVICE; with PGUSER, PGPASSWORD "
    "and the rest); without any, tidegate runs an embedded server.",
)
@_option(
    "--listen-database-url",
    help="PostgreSQL itself, for LISTEN (one connection per process) and the other few "
    "sessions, where --database-url leads to a pooler. Unset: --database-url.",
)
@_option(
    "--database-pooler",
    type=click.Choice(DATABASE_POOLERS),
    help="pgbouncer: --database-url leads to a pooler in transaction mode.",
)
@_option("--require-database-url", type=bool, help="Without a URL, fail: no embedded server.")
@_option("--schema", help="Schema holding tidegate's tables.")
@_option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Where the embedded server keeps its data.  [default: ./{DEFAULT_DATA_DIR} for "
    f"serve, worker and demo; the other commands use the nearest {DEFAULT_DATA_DIR}/ in "
    "this folder or its parents]",
)
@_option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    help="text for people; json, one object per line, for log collectors.",
)
@_option("--verbose", "-v", is_flag=True, help="Log at debug level; tracebacks with errors.")
@click.version_option(__version__, prog_name="tidegate", message="%(prog)s %(version)s")
@click.pass_context
def main(
    ctx: click.Context,
    /,
    database_url: str | None,
    listen_database_url: str | None,
    database_pooler: str,
    require_database_url: bool,
    schema: str,
    data_dir: Path | None,
    log_format: str,
    verbose: bool,
) -> None:
    """tidegate: durable runs on PostgreSQL, claimed by lane-aware workloops."""
    configure_logging(log_format, verbose)
    ctx.obj = {
        "options": {
            "database_url": database_url,
            "listen_database_url": listen_database_url,
            "database_pooler": database_pooler,
            "require_database_url": require_database_url,
            "schema": schema,
            "data_dir": data_dir,
            "log_format": log_format,
        },
        "verbose": verbose,
    }


def _settings(ctx: click.Context, /, *, finds_database: bool = True, **options: Any) -> Settings:
    """Build the command's settings: defaults < ``TIDEGATE_*`` < command line.

    Unless ``finds_database`` is off (``serve``, ``worker``, ``demo``, which make the
    embedded database when there is none), a command with neither a database URL nor a
    data directory uses the nearest ``.tidegate/`` in this folder or its parents, as git
    finds ``.git``, and fails when there is none: a command run from the wrong folder
    must not start an empty database there and report that it holds nothing.
    """
    given = dict(ctx.obj["options"])
    if given["database_url"] is None:
        given["database_url"] = conventional_database_url(os.environ)
    if finds_database and given["database_url"] is None and given["data_dir"] is None:
        given["data_dir"] = find_data_dir(DEFAULT_DATA_DIR, Path.cwd())
        if given["data_dir"] is None:
            raise Failure(NO_DATABASE)
    try:
        settings = Settings.from_env(**given, **options)
    except TidegateError as error:
        raise click.UsageError(str(error)) from None
    ctx.obj["settings"] = settings
    return settings


def _open(ctx: click.Context) -> Tidegate:
    """Return the app of a command that reads or changes runs, projects or policies.

    The schema is checked first, so that one missing or older than this code is one line
    that says to run ``tidegate migrate``, not an error from the first statement.
    """
    app = Tidegate(settings=_settings(ctx))
    with app.database.connect() as conn:
        check_schema(conn, app.settings.schema)
    return app


def _load_app(spec: str, settings: Settings) -> Tidegate:
    module_name, _, attr = spec.partition(":")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
        app = getattr(module, attr or "app")
    except (ImportError, AttributeError) as error:
        raise click.UsageError(f"--app {spec!r}: cannot load it ({error})") from None
    if not isinstance(app, Tidegate):
        raise click.UsageError(f"--app {spec!r} is a {type(app).__name__}, not a Tidegate")
    # The command line's settings win over the ones the module was built with.
    app.settings = settings
    app.database = Database(settings)
    return app


@main.command()
@_option("--app", "app_spec", required=True, help="The app to run, as module:attribute.")
@_option(
    "--workloops",
    help="Slot groups: chains ('fast_lane:1 manual>*:4') or shares ('a=3,b=1/2,*:12').",
)
@_option("--server-url", "--server", help="Remote mode: claim through this API, not the database.")
@_option("--worker-token", "--token", help="Remote mode: the worker token (tgw_...) for it.")
@_option("--lease-seconds", help="How long a claim holds without a heartbeat.")
@_option("--heartbeat-seconds", help="How often leases and the worker row renew.")
@_option("--poll-seconds", help="Safety-net poll when no NOTIFY arrives.")
@_option("--rescue-seconds", help="How often expired leases are looked for.")
@_option("--schedule-seconds", help="How often due schedules are looked for.")
@_option("--shutdown-grace-seconds", help="How long SIGTERM waits for runs.")
@_option("--retention-seconds", help="How long finished runs are kept.")
@click.pass_context
def worker(ctx: click.Context, /, app_spec: str, **options: Any) -> None:
    """Run a worker until SIGTERM/SIGINT, then finish or hand back its runs."""
    settings = _settings(ctx, finds_database=False, **options)
    with _load_app(app_spec, settings) as app:
        app.run_worker()


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Apply the schema migrations this database lacks."""
    with Tidegate(settings=_settings(ctx)) as app, app.database.connect() as conn:
        applied = app.migrate()
        version = schema_version(conn, app.settings.schema)
    click.echo(
        f"schema {app.settings.schema!r} at version {version}"
        + (f" (applied {', '.join(map(str, applied))})" if applied else " (up to date)")
    )


@main.command()
@click.argument("task")
@_command_option("--args", default="{}", help="The run's args, a JSON object.")
@_command_option("--project", default="default", help="The project (tenant) the run is of.")
@_command_option("--lane", help="The run's lane.  [default: the task's declared lane, or 'manual']")
@_command_option("--key", help="Concurrency/fairness key.  [default: the project]")
@_command_option(
    "--priority",
    type=bounded(PRIORITY),
    help="0 runs first.  [default: the task's declared priority, or 0]",
)
@_command_option("--delay", type=float, help="Seconds from now before the run is due.")
@_command_option("--idempotency-key", help="A repeat with the same key returns the first run.")
@_command_option(
    "--max-attempts",
    type=bounded(ATTEMPTS),
    help="[default: the task's declared max_attempts, or TIDEGATE_MAX_ATTEMPTS]",
)
@click.pass_context
def enqueue(ctx: click.Context, /, task: str, args: str, **options: Any) -> None:
    """Enqueue one run of TASK and print it as JSON, as it stands once enqueued.

    What is not given comes from the settings the task's workers declared when they
    started (`tidegate tasks`); a task no worker declared runs in the 'manual' lane. The
    run is read again after the enqueue has committed: a worker may have taken it, or
    finished it, by then, and the state printed is the one it has.
    """
    try:
        loaded = json.loads(args)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--args") from None
    with _open(ctx) as app:
        if options["lane"] is None and not app.execute(find_tasks([task])):
            options["lane"] = "manual"  # a run started by hand, of a task nobody declared
        try:
            run = app.enqueue_many([NewRun(task, loaded, **options)])[0]
        except TidegateError as error:
            raise click.UsageError(str(error)) from None
        run = app.get_run(run.id) or run  # or pruned meanwhile: as enqueued
    _echo(run.to_json())


RUN_ID = click.IntRange(1, MAX_ID)


class RunsCommands(click.Group):
    """``tidegate runs``: with no command the newest runs, with a run's id that run."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0].isdigit():  # tidegate runs 42: tidegate runs show 42
            return "show", self.commands["show"], args
        return super().resolve_command(ctx, args)


@main.group(cls=RunsCommands, invoke_without_command=True)
@_command_option("--project", help="Only the runs of this project.")
@_command_option("--lane", help="Only the runs in this lane.")
@_command_option("--key", help="Only the runs of this concurrency/fairness key.")
@_command_option(
    "--state", type=click.Choice([s.value for s in RunState]), help="Only the runs in this state."
)
@_command_option("--task", help="Only the runs of this task.")
@_command_option(
    "--args",
    help="Only the runs whose args contain this JSON object, e.g. '{\"order\": 7}'.",
)
@_command_option(
    "--limit", type=click.IntRange(1, 10_000), default=20, help="The most runs listed."
)
@_command_option("--json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def runs(ctx: click.Context, /, json: bool, args: str | None, **filters: Any) -> None:
    """List the newest runs; show, cancel or retry one (tidegate runs RUN_ID: show it), or
    every run the filters match (tidegate runs --state discarded retry-matching)."""
    try:
        contained = None if args is None else args_filter(args)
    except TidegateError as error:
        raise click.BadParameter(str(error), param_hint="--args") from None
    if ctx.invoked_subcommand is not None:
        filters.pop("limit")  # the list's; a bulk command has its own
        ctx.obj["run_filters"] = {**filters, "args": contained}
        return
    with _open(ctx) as app:
        found = app.execute(list_runs(**filters, args=contained))
        found = app.execute(with_holds(found))
    if json:
        _echo([run.to_json() for run in found])
    else:
        click.echo(_table(RUN_COLUMNS, [_run_row(run) for run in found], "runs"))


@runs.command("show")
@click.argument("run_id", type=RUN_ID)
@click.pass_context
def runs_show(ctx: click.Context, /, run_id: int) -> None:
    """Show run RUN_ID in full, as JSON."""
    with _open(ctx) as app:
        found = app.execute(with_holds([run] if (run := app.get_run(run_id)) else []))
    if not found:
        raise Failure(f"no run {run_id}")
    _echo(found[0].to_json())


@runs.command("cancel")
@click.argument("run_id", type=RUN_ID)
@click.pass_context
def runs_cancel(ctx: click.Context, /, run_id: int) -> None:
    """Cancel run RUN_ID if it has not finished, and print it. A running attempt's worker
    learns it at its next heartbeat: an async handler is cancelled, a sync one's outcome
    is not recorded (as POST /runs/{id}/cancel and the dashboard's Cancel)."""
    with _open(ctx) as app:
        cancelled = app.cancel(run_id)
        run = cancelled or app.get_run(run_id)
    if run is None:
        raise Failure(f"no run {run_id}")
    if cancelled is None:
        raise Failure(f"run {run_id} has finished already ({run.state})")
    _echo(run.to_json())


@runs.command("retry")
@click.argument("run_id", type=RUN_ID)
@click.pass_context
def runs_retry(ctx: click.Context, /, run_id: int) -> None:
    """Run the finished run RUN_ID again, in the manual lane, and print it (as POST
    /runs/{id}/retry and the dashboard's Retry)."""
    with _open(ctx) as app:
        retried = app.execute(retry_runs([run_id], "manual", channel=app.available_channel))
        run = retried[0] if retried else app.get_run(run_id)
    if run is None:
        raise Failure(f"no run {run_id}")
    if not retried:
        raise Failure(f"run {run_id} has not finished ({run.state})")
    _echo(run.to_json())


def _bulk(ctx: click.Context, action: BulkAction, limit: int) -> None:
    """Retry, cancel or delete what the group's filters match, and print what it did as
    JSON."""
    with _open(ctx) as app:
        done = app.execute(
            bulk_runs(
                action,
                ctx.obj["run_filters"],
                limit,
                available_channel=app.available_channel,
                completed_channel=app.completed_channel,
            )
        )
    _echo({BULK_DONE[action]: done.changed, "more": done.more})


BULK_LIMIT = click.IntRange(1, MAX_BULK_RUNS)
BULK_DONE = {
    BulkAction.RETRY: "retried",
    BulkAction.CANCEL: "cancelled",
    BulkAction.DELETE: "deleted",
}
"""The count's name in a bulk action's answer, as the runs API names it."""


BULK_HELP = {
    BulkAction.RETRY: "Run again, in the default lane, the finished runs the filters before it"
    " match (tidegate runs --task T --state discarded retry-matching), newest first, in"
    " batches that never hold a lock a claim waits for (as POST /runs/retry-matching).",
    BulkAction.CANCEL: "Cancel the unfinished runs the filters before it match, newest first,"
    " in batches (as POST /runs/cancel-matching).",
    BulkAction.DELETE: "Delete the finished runs the filters before it match, newest first, in"
    " batches (as POST /runs/delete-matching); an unfinished run is never deleted.",
}


def _bulk_command(action: BulkAction) -> None:
    """Add ``tidegate runs [filters] <action>-matching``: one command per bulk action."""

    @runs.command(f"{action}-matching", help=BULK_HELP[action])
    @_command_option(
        "--limit",
        type=BULK_LIMIT,
        default=1000,
        help=f"The most runs {BULK_DONE[action]}; 'more' says if any are left.",
    )
    @click.pass_context
    def command(ctx: click.Context, /, limit: int) -> None:
        _bulk(ctx, action, limit)


for _action in BulkAction:
    _bulk_command(_action)


RUN_COLUMNS = ("ID", "TASK", "LANE", "KEY", "STATE", "ATTEMPT", "INSERTED", "REASON")
"""The runs table; REASON, last, says why a run waits (most have none)."""


def _run_row(run: Run) -> tuple[str, ...]:
    return (
        str(run.id),
        run.task,
        run.lane,
        run.key,
        run.state,
        run.attempts,
        run.inserted_at.strftime("%Y-%m-%d %H:%M:%S"),
        run.reason or "",
    )


TASK_COLUMNS = ("TASK", "LANE", "PRIORITY", "ATTEMPTS", "TIMEOUT", "KEY", "DECLARED BY", "AT")


@main.command()
@_command_option("--json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def tasks(ctx: click.Context, /, json: bool) -> None:
    """List the tasks the workers declared, with the settings a run enqueued by name gets
    (ATTEMPTS '-': TIDEGATE_MAX_ATTEMPTS; TIMEOUT '-': none; KEY: the task's key function,
    which only its workers can run)."""
    with _open(ctx) as app:
        declared = app.execute(list_tasks())
    if json:
        _echo([task.to_json() for task in declared])
        return
    rows: list[tuple[str, ...]] = [
        (
            task.name,
            task.lane,
            str(task.priority),
            "-" if task.max_attempts is None else str(task.max_attempts),
            "-" if task.timeout_seconds is None else f"{task.timeout_seconds:g}s",
            task.key_function or "-",
            task.declared_by or "",
            task.updated_at.strftime("%Y-%m-%d %H:%M:%S") if task.updated_at else "",
        )
        for task in declared
    ]
    click.echo(_table(TASK_COLUMNS, rows, "tasks declared"))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], things: str) -> str:
    """Lay ``rows`` out in columns under ``header``; none: a line that says so."""
    if not rows:
        return f"no {things}"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


@main.command()
@click.pass_context
def db(ctx: click.Context) -> None:
    """Tell where the database is and its state."""
    settings = _settings(ctx)
    info: dict[str, Any] = {
        "database": describe_database(settings, name=True),
        "schema": settings.schema,
        "code_version": latest_version(),
    }
    if settings.database_url is None:
        info["embedded"] = embedded_status(settings.data_dir)
    else:
        with Database(settings).connect() as conn:
            release = read_schema_release(conn, settings.schema)
            info["schema_version"] = release.version
            info["schema_serves_from"] = release.serves_from
            info["server_version"] = conn.info.server_version
    click.echo(json.dumps(info, indent=2))


@main.command()
@_command_option(
    "--runs", type=click.IntRange(1, 100_000), default=200, help="How many runs to enqueue."
)
@click.pass_context
def demo(ctx: click.Context, /, runs: int) -> None:
    """Enqueue runs across lanes, run a worker until they finish, show the result."""
    from tidegate.demo import run_demo

    run_demo(_settings(ctx, finds_database=False, workloops=DEMO_WORKLOOPS), runs)


@main.command()
@_option(
    "--role",
    type=click.Choice(["all", "api", "worker"]),
    default="all",
    help="What this process runs: the HTTP API, a worker, or both.",
)
@_option("--host", help="Address the HTTP API listens on.")
@_option("--port", help="Port of the HTTP API (0: any free one).")
@_option("--api-processes", help="HTTP API processes.")
@_option(
    "--app",
    "app_spec",
    default="tidegate.builtin:app",
    help="The app whose tasks the worker runs, as module:attribute.",
)
@_option("--workloops", default=SERVE_WORKLOOPS, help="The worker's slot groups.")
@_option(
    "--admin-token",
    help="The super admin's token, stored (hashed) for every server; else the stored one, "
    "or one generated on the first start and printed once.",
)
@_option("--fast-lane-cap", help="In-flight fast-lane runs per project without a cap of its own.")
@_option("--metrics-max-lanes", help="The most lanes GET /metrics reports.")
@_option("--metrics-max-projects", help="The most projects GET /metrics reports (the busiest).")
@_option("--metrics-max-keys", help="The most keys GET /metrics reports (the busiest; 0: none).")
@_option("--webhook-log-size", help="The most refused requests the webhook log keeps per trigger.")
@_option(
    "--webhook-log-body-bytes",
    help="How much of a refused request's body the webhook log keeps.",
)
@_option(
    "--max-claims-per-token",
    help="The most long-polling claims a worker token's remote workers hold at once, per "
    "API process.",
)
@_option("--max-streams", help="The most event streams an API process serves at once.")
@_option(
    "--max-streams-per-caller",
    help="The most event streams one caller holds at once, per API process.",
)
@_option("--ui-session-seconds", help="How long a dashboard (/ui) session lasts after signing in.")
@_option("--access-log", is_flag=True, help="Log every HTTP request.")
@click.pass_context
def serve(
    ctx: click.Context, /, role: str, app_spec: str, access_log: bool, **options: Any
) -> None:
    """Run the HTTP API and a worker (embedded PostgreSQL unless a URL is given).

    The worker is restarted if it dies; SIGTERM or Ctrl+C stops both.
    """
    from tidegate.serve import serve as run_serve

    settings = _settings(ctx, finds_database=False, **options)
    sys.exit(run_serve(settings, role, app_spec, verbose=ctx.obj["verbose"], access_log=access_log))


@main.group()
def projects() -> None:
    """Create, change and list projects (tenants) and their limits."""


_limits = _bounded_options(
    PROJECT_BOUNDS,
    {
        "fast_lane_cap": "In-flight fast-lane runs.",
        "concurrency": "In-flight runs outside the fast lane.",
        "ingest_rate": "Webhooks per second.",
        "ingest_burst": "Webhooks at once above the rate.",
        "backlog_cap": "Ready runs per lane.",
    },
)
_trigger_numbers = _bounded_options(
    TRIGGER_BOUNDS,
    {
        "max_body_bytes": "The most a webhook's body, with the headers kept, may be.",
        "sync_timeout_seconds": "How long a sync caller waits for its run's result.",
        "unique_period": "Seconds: webhooks alike within a window of this many make one run, "
        "and the others are answered with it.",
    },
)


def _unique_options(function: FC) -> FC:
    """The options that say how a trigger's webhooks are alike (with --unique-period)."""
    function = _command_option(
        "--unique-states",
        callback=_names,
        help="The states a run holds its key in, comma-separated; a trigger without them: "
        f"{','.join(DEFAULT_STATES)}.",
    )(function)
    return _command_option(
        "--unique-args",
        callback=_names,
        help="The fields of the body that make webhooks alike, comma-separated ('' for "
        "none: one run per window); a trigger without them: the whole body.",
    )(function)


_key_from = _command_option(
    "--key-from",
    help="Where each run takes its key: a JSON pointer into the body (/data/order/id) or "
    "header:Header-Name. A webhook without a key there is refused 422. A trigger without "
    "it: the project's key.",
)


def _names(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """A comma-separated list of names ('': none); ``None`` when the option is not given."""
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _admin(ctx: click.Context, steps: Any) -> Any:
    from tidegate.errors import InputError
    from tidegate.policies import PolicyError
    from tidegate.projects import NotFoundError, domain_error
    from tidegate.schedules import ScheduleError

    with _open(ctx) as app:
        try:
            return app.execute(steps)
        except psycopg.errors.IntegrityError as error:
            raise Failure(str(domain_error(error))) from None
        except (InputError, NotFoundError, PolicyError, ScheduleError) as error:
            raise Failure(str(error)) from None


def _echo(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@projects.command("create")
@click.argument("project_id")
@_limits
@click.pass_context
def projects_create(ctx: click.Context, /, project_id: str, **limits: Any) -> None:
    """Create PROJECT_ID; prints its API token, shown only this once."""
    from tidegate.projects import create_project

    given = {name: value for name, value in limits.items() if value is not None}
    _echo(_admin(ctx, create_project(project_id, **given)))


@projects.command("update")
@click.argument("project_id")
@_limits
@_command_option("--clear", multiple=True, help="A limit to remove, e.g. --clear ingest_rate.")
@click.pass_context
def projects_update(
    ctx: click.Context, /, project_id: str, clear: tuple[str, ...], **limits: Any
) -> None:
    """Change limits of PROJECT_ID; the next request sees them."""
    from tidegate.projects import update_project

    changes = {name: value for name, value in limits.items() if value is not None}
    changes.update({name.replace("-", "_"): None for name in clear})
    _echo(_admin(ctx, update_project(project_id, **changes)))


@projects.command("rotate-token")
@click.argument("project_id")
@click.pass_context
def projects_rotate_token(ctx: click.Context, /, project_id: str) -> None:
    """Give PROJECT_ID a new API token; prints it, shown only this once. The old token is
    refused from its next request on, and the dashboard sessions opened with it end."""
    from tidegate.projects import rotate_project_token

    _echo(_admin(ctx, rotate_project_token(project_id)))


@projects.command("list")
@click.pass_context
def projects_list(ctx: click.Context, /) -> None:
    """List projects and their limits."""
    from tidegate.projects import list_projects

    _echo(_admin(ctx, list_projects()))


@main.group()
def triggers() -> None:
    """Create, change and list the webhook triggers of projects."""


_MODE_HELP = "async: answered 202 at once; sync: the caller waits for the run's result."


def _show_trigger(ctx: click.Context, steps: Steps[dict[str, Any]]) -> None:
    """Run ``steps``, which make or change a trigger, and print it with its URL path and
    its warnings, as the admin API answers; each warning also goes to the log (stderr),
    where a person sees it."""
    from tidegate.projects import trigger_warnings

    live_seconds = 3 * _settings(ctx).heartbeat_seconds

    def shown() -> Steps[dict[str, Any]]:
        trigger = yield from steps
        warnings = yield from trigger_warnings(trigger, live_seconds)
        return {**trigger, "url": f"/hooks/{trigger['token']}", "warnings": warnings}

    answer = _admin(ctx, shown())
    for warning in answer["warnings"]:
        log.warning("trigger %d (%s): %s", answer["id"], answer["name"], warning)
    _echo(answer)


@triggers.command("create")
@click.argument("project_id")
@click.argument("name")
@_command_option("--mode", type=click.Choice(["async", "sync"]), required=True, help=_MODE_HELP)
@_command_option("--task", required=True, help="The task each webhook runs.")
@_command_option("--secret", help="Standard Webhooks secret (whsec_...) to verify signatures.")
@_trigger_numbers
@_unique_options
@_key_from
@click.pass_context
def triggers_create(
    ctx: click.Context, /, project_id: str, name: str, mode: str, task: str, **options: Any
) -> None:
    """Create trigger NAME of PROJECT_ID; prints it with its URL path, and warns when no
    live worker has its task."""
    from tidegate.projects import create_trigger

    given = {k: v for k, v in options.items() if v is not None}
    _show_trigger(ctx, create_trigger(project_id, name, mode=mode, task=task, **given))


@triggers.command("update")
@click.argument("trigger_id", type=int)
@_command_option("--mode", type=click.Choice(["async", "sync"]), help=_MODE_HELP)
@_command_option("--task", help="The task each webhook runs.")
@_command_option("--secret", help="Standard Webhooks secret (whsec_...) to verify signatures.")
@_trigger_numbers
@_unique_options
@_command_option(
    "--no-unique",
    is_flag=True,
    help="Each webhook makes its own run again (clears --unique-period and the rest).",
)
@_key_from
@_command_option(
    "--no-key-from", is_flag=True, help="Runs take the project's key again (clears --key-from)."
)
@_command_option(
    "--enabled/--disabled",
    default=None,
    help="A disabled trigger answers 404, as if it did not exist.",
)
@click.pass_context
def triggers_update(
    ctx: click.Context, /, trigger_id: int, no_unique: bool, no_key_from: bool, **changes: Any
) -> None:
    """Change trigger TRIGGER_ID; prints it, and warns when no live worker has its task."""
    from tidegate.projects import update_trigger

    given = {k: v for k, v in changes.items() if v is not None}
    if no_unique:
        if {"unique_period", "unique_args", "unique_states"} & set(given):
            raise click.UsageError("--no-unique clears the unique options: give none of them")
        given["unique_period"] = None
    if no_key_from:
        if "key_from" in given:
            raise click.UsageError("--no-key-from clears --key-from: give one of them")
        given["key_from"] = None
    _show_trigger(ctx, update_trigger(trigger_id, **given))


@triggers.command("rotate")
@click.argument("project_id")
@click.argument("name")
@click.pass_context
def triggers_rotate(ctx: click.Context, /, project_id: str, name: str) -> None:
    """Give trigger NAME of PROJECT_ID a new URL; prints it. Every API process answers the
    old one 404 within a second (each keeps a trigger it looked up for that long)."""
    from tidegate.projects import rotate_trigger_token

    _show_trigger(ctx, rotate_trigger_token(project_id, name))


@triggers.command("list")
@click.argument("project_id", required=False)
@click.pass_context
def triggers_list(ctx: click.Context, /, project_id: str | None) -> None:
    """List triggers (of PROJECT_ID, or of every project)."""
    from tidegate.projects import list_triggers

    _echo(_admin(ctx, list_triggers(project_id)))


@main.group("admin-token")
def admin_token() -> None:
    """The super admin's token: kept hashed in the database, the same for every server."""


@admin_token.command("rotate")
@_command_option("--token", help="The new token (else one is generated and printed once).")
@click.pass_context
def admin_token_rotate(ctx: click.Context, /, token: str | None) -> None:
    """Replace the super admin's token; every running server honours it at once.

    A server started with TIDEGATE_ADMIN_TOKEN stores that token again when it restarts.
    """
    from tidegate.access import set_admin_token
    from tidegate.limits import check_token
    from tidegate.projects import new_token

    if token is not None:
        try:
            check_token(token, "the token")
        except TidegateError as error:
            raise click.BadParameter(str(error), param_hint="--token") from None
    chosen = token or new_token("tga")
    _admin(ctx, set_admin_token(chosen))
    click.echo(chosen if token is None else "tidegate: the super admin token is replaced")


@main.group("worker-tokens")
def worker_tokens() -> None:
    """Tokens of remote workers (docs/workers.md): each allows the lanes it names."""


@worker_tokens.command("create")
@click.argument("name")
@_command_option(
    "--lanes",
    required=True,
    help="Comma-separated lanes its workers may claim from; '*' for any lane.",
)
@click.pass_context
def worker_tokens_create(ctx: click.Context, /, name: str, lanes: str) -> None:
    """Create a worker token NAME; prints the token, shown only this once."""
    from tidegate.remote import create_worker_token

    chosen = [lane.strip() for lane in lanes.split(",") if lane.strip()]
    _echo(_admin(ctx, create_worker_token(name, chosen)))


@worker_tokens.command("list")
@click.pass_context
def worker_tokens_list(ctx: click.Context, /) -> None:
    """List worker tokens, their lanes and live workers."""
    from tidegate.remote import list_worker_tokens

    settings = _settings(ctx)
    _echo(_admin(ctx, list_worker_tokens(3 * settings.heartbeat_seconds)))


@worker_tokens.command("delete")
@click.argument("name")
@click.pass_context
def worker_tokens_delete(ctx: click.Context, /, name: str) -> None:
    """Delete worker token NAME: its workers are refused from their next call on."""
    from tidegate.remote import delete_worker_token

    _admin(ctx, delete_worker_token(name))
    click.echo(f"tidegate: worker token {name!r} deleted")


@main.group()
def keys() -> None:
    """Per-key policies in a lane: max running, weight, rate, strict order, circuit breaker
    (KEY '*': the lane's default)."""


@keys.command("set")
@click.argument("lane")
@click.argument("key", default="*")
@_bounded_options(
    POLICY_BOUNDS,
    {
        "max_running": "Runs of the key in flight.",
        "weight": "Share of claims.",
        "rate": "Starts per second.",
        "rate_burst": "Starts at once above the rate.",
        "breaker_failures": "Circuit breaker: open after this many failed attempts in the window.",
        "breaker_ratio": "Or: open when this share of the window's attempts failed.",
        "breaker_min_attempts": "The ratio's least attempts (10).",
        "breaker_window_seconds": "Counting window (60).",
        "breaker_cooldown_seconds": "First open time (30).",
        "breaker_max_cooldown_seconds": "A failed probe doubles the cooldown up to this (600).",
        "breaker_probes": "Half-open: probe runs at once (1).",
    },
)
@_command_option(
    "--ordered/--unordered",
    default=None,
    show_default=False,
    help="Strict order: the key's runs one at a time, in enqueue order; a failed run that "
    "will retry holds the ones behind it.",
)
@_command_option("--clear", multiple=True, help="A limit to remove, e.g. --clear max_running.")
@click.pass_context
def keys_set(
    ctx: click.Context, /, lane: str, key: str, clear: tuple[str, ...], **fields: Any
) -> None:
    """Set the policy of KEY in LANE; the next claim sees it."""
    from tidegate.policies import set_key_policy

    changes = {name: value for name, value in fields.items() if value is not None}
    changes.update({name.replace("-", "_"): None for name in clear})
    _echo(_admin(ctx, set_key_policy(lane, key, **changes)))


@keys.command("clear")
@click.argument("lane")
@click.argument("key", default="*")
@click.pass_context
def keys_clear(ctx: click.Context, /, lane: str, key: str) -> None:
    """Remove the policy of KEY in LANE."""
    from tidegate.policies import clear_key_policy

    if not _admin(ctx, clear_key_policy(lane, key)):
        raise Failure(f"no policy for key {key!r} in lane {lane!r}")


@keys.command("list")
@click.argument("lane", required=False)
@click.pass_context
def keys_list(ctx: click.Context, /, lane: str | None) -> None:
    """List key policies (of LANE, or of every lane)."""
    from tidegate.policies import list_key_policies

    _echo(_admin(ctx, list_key_policies(lane)))


@keys.command("breakers")
@click.argument("lane", required=False)
@click.pass_context
def keys_breakers(ctx: click.Context, /, lane: str | None) -> None:
    """List circuit breakers (of LANE, or of every lane) that are open, half-open, forced,
    or counting failures."""
    from tidegate.policies import list_breakers

    _echo(_admin(ctx, list_breakers(lane)))


@keys.command("force")
@click.argument("lane")
@click.argument("key")
@click.argument("force", type=click.Choice(["open", "closed", "auto"]))
@click.pass_context
def keys_force(ctx: click.Context, /, lane: str, key: str, force: str) -> None:
    """Force the circuit breaker of KEY in LANE open or closed; auto hands it back to its
    policy (closed, counting afresh)."""
    from tidegate.policies import force_breaker

    shown = _admin(ctx, force_breaker(lane, key, None if force == "auto" else force))
    _echo(shown or {"lane": lane, "key": key, "state": "closed"})


LANE_COLUMNS = ("LANE", *(state.upper() for state in ACTIVE_STATES), "LAG", "PAUSED")
"""The lanes table; PAUSED, last: since when, from where and why, or nothing."""


@main.group(invoke_without_command=True)
@_command_option("--json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def lanes(ctx: click.Context, /, json: bool) -> None:
    """List the lanes (runs by state, lag, pause); pause or resume one."""
    if ctx.invoked_subcommand is not None:
        return
    from tidegate.figures import read_lanes

    with _open(ctx) as app:
        found = app.execute(read_lanes(app.settings))
    if json:
        _echo([lane.to_json() for lane in found])
    else:
        click.echo(_table(LANE_COLUMNS, [_lane_row(lane) for lane in found], "lanes"))


def _lane_row(lane: LaneFigures) -> tuple[str, ...]:
    paused = lane.paused
    why = ""
    if paused is not None:
        why = f"since {paused.paused_at:%Y-%m-%d %H:%M:%S}, by {paused.paused_by}"
        why += f": {paused.reason}" if paused.reason else ""
    depths = tuple(str(lane.depth[state]) for state in ACTIVE_STATES)
    return (lane.lane, *depths, f"{lane.lag_seconds:.1f}", why)


@lanes.command("pause")
@click.argument("lane")
@_command_option("--reason", help="Why, shown wherever the pause is listed (255 characters).")
@click.pass_context
def lanes_pause(ctx: click.Context, /, lane: str, reason: str | None) -> None:
    """Pause LANE: once this returns, no claim that starts takes its runs, on any worker;
    running runs go on to their end, new runs wait, its sync webhooks get 503."""
    from tidegate.lanes import pause_lane

    _echo(_admin(ctx, pause_lane(lane, by=_operator(), reason=reason)).to_json())


def _operator() -> str:
    """Who pauses from the command line: the CLI, its user and host."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment, nor in passwd
        user = "?"
    return f"cli ({user}@{socket.gethostname()})"[:MAX_TEXT_CHARS]


@lanes.command("resume")
@click.argument("lane")
@click.pass_context
def lanes_resume(ctx: click.Context, /, lane: str) -> None:
    """Resume LANE and wake its workers."""
    from tidegate.errors import InputError
    from tidegate.lanes import resume_lane

    with _open(ctx) as app:
        try:
            was_paused = app.execute(resume_lane(lane, channel=app.available_channel))
        except InputError as error:
            raise Failure(str(error)) from None
    click.echo(f"tidegate: lane {lane!r} " + ("resumed" if was_paused else "was not paused"))


@main.group()
def schedules() -> None:
    """Cron and interval schedules of projects: one run per tick (see tidegate.schedules)."""


@schedules.command("create")
@click.argument("project_id")
@click.argument("name")
@_command_option("--task", required=True, help="The task each tick runs.")
@_command_option("--cron", help="Cron expression: 5 fields, 6 with seconds first, or @daily.")
@_command_option(
    "--every",
    type=bounded(SCHEDULE_BOUNDS["interval_seconds"]),
    help="Or: seconds between ticks.",
)
@_command_option("--timezone", default="UTC", help="IANA time zone the cron is read in.")
@_command_option("--args", default="{}", help="The runs' args, a JSON object.")
@_command_option("--lane", help="Lane of its runs.  [default: the task's]")
@_command_option("--key", help="Concurrency/fairness key.  [default: the task's, or the project]")
@_command_option(
    "--priority",
    type=bounded(SCHEDULE_BOUNDS["priority"]),
    help="0 runs first.  [default: the task's, or 0]",
)
@_command_option(
    "--max-attempts",
    type=bounded(SCHEDULE_BOUNDS["max_attempts"]),
    help="[default: the task's, or TIDEGATE_MAX_ATTEMPTS]",
)
@_command_option(
    "--catch-up",
    type=click.Choice(["once", "all", "skip"]),
    default="once",
    help="After downtime: the newest missed tick, each one, or none.",
)
@_command_option(
    "--catch-up-limit",
    type=bounded(SCHEDULE_BOUNDS["catch_up_limit"]),
    default=100,
    help="With --catch-up all: the most missed ticks run.",
)
@_command_option(
    "--overlap",
    type=click.Choice(["allow", "skip"]),
    default="allow",
    help="While its last run has yet to finish: make another, or skip the tick.",
)
@_command_option("--paused", is_flag=True, help="Create it paused.")
@click.pass_context
def schedules_create(
    ctx: click.Context,
    /,
    project_id: str,
    name: str,
    task: str,
    args: str,
    every: float | None,
    **options: Any,
) -> None:
    """Create schedule NAME of PROJECT_ID; prints it with its first tick."""
    from tidegate.schedules import create_schedule

    try:
        loaded = json.loads(args)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--args") from None
    steps = create_schedule(project_id, name, task, args=loaded, interval_seconds=every, **options)
    _echo(_admin(ctx, steps))


SCHEDULE_COLUMNS = ("PROJECT", "NAME", "TASK", "WHEN", "NEXT TICK", "LAST RUN", "LAST ERROR")
"""The schedules table; LAST ERROR, last, says why the last tick made no run."""


def _schedule_row(schedule: dict[str, Any]) -> tuple[str, ...]:
    if schedule["cron"] is not None:
        when = f"{schedule['cron']} ({schedule['timezone']})"
    else:
        when = f"every {schedule['interval_seconds']:g}s"
    next_tick = "paused" if schedule["paused"] else f"{schedule['next_tick']:%Y-%m-%d %H:%M:%S}"
    last_run = ""
    if schedule["last_run_id"] is not None:
        last_run = f"{schedule['last_run_id']} {schedule['last_run_state'] or 'pruned'}"
    return (
        schedule["project"],
        schedule["name"],
        schedule["task"],
        when,
        next_tick,
        last_run,
        schedule["last_error"] or "",
    )


@schedules.command("list")
@click.argument("project_id", required=False)
@_command_option("--json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def schedules_list(ctx: click.Context, /, project_id: str | None, json: bool) -> None:
    """List schedules (of PROJECT_ID, or of all): when they tick, the next tick, the last
    run and its state; times in UTC."""
    from tidegate.schedules import list_schedules

    found = _admin(ctx, list_schedules(project_id))
    if json:
        _echo(found)
    else:
        click.echo(_table(SCHEDULE_COLUMNS, [_schedule_row(s) for s in found], "schedules"))


@schedules.command("pause")
@click.argument("project_id")
@click.argument("name")
@click.pass_context
def schedules_pause(ctx: click.Context, /, project_id: str, name: str) -> None:
    """Pause schedule NAME: no runs until it is resumed."""
    from tidegate.schedules import update_schedule

    _echo(_admin(ctx, update_schedule(project_id, name, paused=True)))


@schedules.command("resume")
@click.argument("project_id")
@click.argument("name")
@click.pass_context
def schedules_resume(ctx: click.Context, /, project_id: str, name: str) -> None:
    """Resume schedule NAME from its first tick after now."""
    from tidegate.schedules import update_schedule

    _echo(_admin(ctx, update_schedule(project_id, name, paused=False)))


@schedules.command("delete")
@click.argument("project_id")
@click.argument("name")
@click.pass_context
def schedules_delete(ctx: click.Context, /, project_id: str, name: str) -> None:
    """Delete schedule NAME (its runs stay; one declared in code comes back when a worker
    with its task starts)."""
    from tidegate.schedules import delete_schedule

    if not _admin(ctx, delete_schedule(project_id, name)):
        raise Failure(f"no schedule {name!r} in project {project_id!r}")
