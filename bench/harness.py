"""What the benchmark's modules share: processes, schemas, figures, descriptions, results.

It imports nothing but the standard library and psycopg, because the driver imports it
in every peer's environment too. Worker processes are started by the harness, report
readiness on stderr, and are stopped with SIGTERM; a worker that dies takes the
measurement down with it, its last log lines in the error. ``bench.webhooks`` measures on
schemas of its own (``bench_<side>_<hex>``), created just before and dropped just after;
``bench.run`` on databases of their own.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 0.1
"""How often the harness looks at the database while it waits for a worker."""


class BenchError(RuntimeError):
    """A measurement could not be made, or its result did not check out."""


# -- schemas and connections -----------------------------------------------------------


def schema_conninfo(url: str, schema: str) -> str:
    """Return a connection string whose ``search_path`` is ``schema``."""
    return make_conninfo(url, options=f"-c search_path={schema}", application_name="tidegate-bench")


@contextlib.contextmanager
def fresh_schema(url: str, side: str) -> Iterator[str]:
    """Create an empty schema for one measurement; drop it afterwards."""
    name = f"bench_{side}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def paced(count: int, interval: float) -> Iterator[int]:
    """Yield ``0 .. count-1``, the k-th at ``start + k * interval`` (no drift from work)."""
    start = time.monotonic()
    for k in range(count):
        delay = start + k * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield k


# -- worker processes ----------------------------------------------------------------


def child_env(**values: str) -> dict[str, str]:
    """Return the environment of a worker process: no inherited ``TIDEGATE_*`` options.

    A ``TIDEGATE_POLL_SECONDS`` left in the caller's shell would otherwise change the
    worker under test; the benchmark measures tidegate's defaults.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(values)
    return env


class WorkerProcess:
    """A worker started by the harness; ready once ``ready_marker`` shows on its stderr."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], ready_marker: str) -> None:
        self.argv = list(argv)
        self.ready_marker = ready_marker
        self.ready = threading.Event()
        self.log: deque[str] = deque(maxlen=40)
        self.started_at = time.time()
        self.process = subprocess.Popen(
            self.argv,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="bench-worker-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            if self.ready_marker in line:
                self.ready.set()

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            self._reader.join(2)
            raise BenchError(f"worker exited with {code}:\n" + "\n".join(self.log))

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Wait until the worker says it listens and claims; return when, in wall time."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(POLL_SECONDS):
            self.check_alive()
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"worker not ready within {timeout:.0f}s:\n" + "\n".join(self.log))
        return time.time()

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the worker and require a clean exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchError(f"worker did not stop within {timeout:.0f}s") from None
        self._reader.join(2)
        if code != 0:
            raise BenchError(f"worker exited with {code}:\n" + "\n".join(self.log))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # a no-op after a clean stop()


def progress(line: str) -> None:
    """Tell the person running a benchmark how far it has got (stderr, at once)."""
    print(line, file=sys.stderr, flush=True)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# -- figures -------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """Return p50, p95, p99 and max (inclusive method: p100 is the largest sample)."""
    if len(values) < 2:
        only = float(values[0]) if values else float("nan")
        return {"p50": only, "p95": only, "p99": only, "max": only}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98], "max": float(max(values))}


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Return the median, min and max of repeated measurements, and the values."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


# -- where the figures come from -------------------------------------------------------


SERVER_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "max_wal_size",
    "max_connections",
)


def server_info(url: str) -> dict[str, Any]:
    """Describe the PostgreSQL server: version and the settings that move the figures."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT version(), current_setting('server_version')").fetchone()
        assert row is not None
        settings = {
            name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]  # type: ignore[index]
            for name in SERVER_SETTINGS
        }
        host = conn.info.host
    return {
        "version": row[1],
        "version_string": row[0],
        "major": int(str(row[1]).split(".")[0]),
        "settings": settings,
        "connection": "unix socket" if host.startswith("/") else f"tcp {host}",
    }


def machine_info() -> dict[str, Any]:
    """Describe this machine: cores, memory, CPU model, load when the run started."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def source_digest(package_dir: Path) -> str:
    """Return a short hash of a tidegate source tree (its ``.py`` and ``.sql`` files)."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        if path.suffix in (".py", ".sql") and path.is_file():
            digest.update(str(path.relative_to(package_dir)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def tidegate_dir() -> Path:
    """Return the directory of the tidegate package this process imports."""
    import tidegate

    return Path(tidegate.__file__).resolve().parent


def code_info() -> dict[str, Any]:
    """Name the tidegate code under test: the commit, and the hash of the source itself.

    ``src_modified`` says the working tree's ``src/tidegate`` differs from the commit; the
    hash is of the package actually imported (a ``--snapshot`` copy, or the tree).
    """
    info: dict[str, Any] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--", "src/tidegate"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["src_modified"] = bool(changed)
    info["src_sha256"] = source_digest(tidegate_dir())
    return info


# -- results, docs and the code measured -------------------------------------------------


RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
EMBEDDED_DATA_DIR = ROOT / ".tidegate" / "bench"
SNAPSHOT_ENV = "BENCH_TIDEGATE_SNAPSHOT"
"""Set in a run that re-executed itself on a copy of ``src/tidegate`` (``--snapshot``)."""
CODE_ENV = "BENCH_TIDEGATE_CODE"


def redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def write_results(result: dict[str, Any], path: Path) -> None:
    """Write JSON through a temporary file, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)


def write_between(docs: Path, name: str, body: str) -> None:
    """Replace the text between the ``bench:NAME`` markers of ``docs`` with ``body``.

    The file is read just before it is written, so edits made to the rest of it
    meanwhile are kept.
    """
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    text = docs.read_text()
    if begin not in text or end not in text:
        raise BenchError(f"{docs} lacks the markers {begin} ... {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    tmp = docs.with_suffix(".md.tmp")
    tmp.write_text(f"{head}{begin}\n\n{body}\n{end}{tail}")
    tmp.replace(docs)


def drain_parser(prog: str, description: str, smoke: str) -> argparse.ArgumentParser:
    """The options of a drain benchmark (``bench.scale``, ``bench.remote``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--runs", type=int, default=20_000, help="runs per drain (20,000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--snapshot", action="store_true", help="measure a copy of the code")
    parser.add_argument("--smoke", action="store_true", help=smoke)
    return parser


def publish(
    result: dict[str, Any], text: str, label: str, *, smoke: bool, write_docs: bool
) -> None:
    """Print a run's table; unless it was a smoke run, keep its results as
    ``results/LABEL.json`` and, when asked, put the table in docs/benchmarks.md."""
    print(text)
    if smoke:
        return
    write_results(result, RESULTS / f"{label}.json")
    if write_docs:
        write_between(DOCS, label, text)
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)


def code_measured() -> dict[str, Any]:
    """The code under test: as ``--snapshot`` recorded it, else the tree's."""
    return json.loads(os.environ[CODE_ENV]) if CODE_ENV in os.environ else code_info()


def reexec_on_snapshot(module: str, argv: list[str]) -> None:
    """Copy ``src/tidegate`` aside and run ``python -m module argv`` on it (never returns).

    The copy goes first on ``PYTHONPATH``, so the new process and every process it
    starts import it rather than the working tree: edits made while a benchmark runs
    cannot mix two versions of the code in one run. The copy is removed at the end.
    """
    code = code_info()
    snapshot = Path(tempfile.mkdtemp(prefix="tidegate-bench-src-"))
    shutil.copytree(
        ROOT / "src" / "tidegate",
        snapshot / "tidegate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    code["src_sha256"] = source_digest(snapshot / "tidegate")
    code["snapshot"] = True
    path = [str(snapshot), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        SNAPSHOT_ENV: str(snapshot),
        CODE_ENV: json.dumps(code),
    }
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def new_record(url: str, command: str, embedded: bool, **fields: Any) -> dict[str, Any]:
    """Begin a run's results: when, how, where and on what code, then ``fields``."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "embedded": embedded,
        "machine": machine_info(),
        "server": server_info(url),
        "code": code_measured(),
        **fields,
    }


def close_record(result: dict[str, Any], started: float, progress: Callable[[str], None]) -> None:
    """End a run's results: its length, the load at the end, and whether the code moved."""
    result["seconds"] = round(time.monotonic() - started, 1)
    result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if source_digest(tidegate_dir()) != result["code"].get("src_sha256"):
        # Processes started late in the run loaded different code than early ones.
        result["code"]["changed_during_run"] = True
        progress("warning: src/tidegate changed while the benchmark ran")


def start_run(
    module: str, argv: list[str], database_url: str | None, snapshot: bool
) -> tuple[str, bool]:
    """Begin a benchmark command: on a snapshot of the code if asked, then pick the server.

    Return the server's URL and whether it is the embedded one, which is started here
    when neither ``database_url`` nor ``TIDEGATE_DATABASE_URL`` names a server.
    """
    if snapshot and SNAPSHOT_ENV not in os.environ:
        reexec_on_snapshot(module, argv)
    if SNAPSHOT_ENV in os.environ:  # the re-executed run removes its snapshot at exit
        atexit.register(shutil.rmtree, os.environ[SNAPSHOT_ENV], ignore_errors=True)
    url = database_url or os.environ.get("TIDEGATE_DATABASE_URL")
    if url:
        return url, False
    from tidegate.storage.embedded import start_embedded

    return start_embedded(EMBEDDED_DATA_DIR), True
