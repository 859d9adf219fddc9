"""tidegate.testing, the pytest plugin an application's tests use: the fixtures, and the
harness's ``enqueued``/``assert_enqueued``, ``drain`` and ``perform``.

The harness's tests use the plugin's own fixtures (this suite gets them as any user
does, through the ``pytest11`` entry point). Those about the plugin itself (the ini
option, a schema per test, harmless when unused) run a user's project with
``pytester``, in a separate pytest process, so the entry point is what loads it.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from typing import Any

import psycopg
import pytest

from tidegate import Cancel, Discard, Retry, RunState, SchemaError, Tidegate, current_run
from tidegate.testing import Harness

pytest_plugins = ["pytester"]


@pytest.fixture
def harness(tidegate_app: Tidegate) -> Harness:
    return Harness(tidegate_app)


# -- enqueued and assert_enqueued -----------------------------------------------------


def test_assert_enqueued_matches_a_task_and_args_it_contains(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    @tidegate_app.task
    def send(to: str, subject: str) -> None: ...

    first = tidegate_app.enqueue(send, {"to": "a@example.com", "subject": "hi"})
    tidegate_app.enqueue(send, {"to": "b@example.com", "subject": "hi"}, delay=60)
    tidegate_app.enqueue("other", {"to": "a@example.com"})

    assert harness.assert_enqueued(send, args={"to": "a@example.com"}).id == first.id
    assert harness.assert_enqueued(send.name).id == first.id
    assert [r.args["to"] for r in harness.enqueued(send)] == ["a@example.com", "b@example.com"]
    assert len(harness.enqueued()) == 3
    with pytest.raises(AssertionError) as failed:
        harness.assert_enqueued(send, args={"to": "c@example.com"})
    assert str(failed.value) == (
        "no run of 'tests.test_testing.test_assert_enqueued_matches_a_task_and_args_it_"
        "contains.<locals>.send' with args containing {'to': 'c@example.com'} is enqueued; "
        "its enqueued runs' args: [{'to': 'a@example.com', 'subject': 'hi'}, "
        "{'to': 'b@example.com', 'subject': 'hi'}]"
    )


def test_a_run_that_started_is_no_longer_enqueued(tidegate_app: Tidegate, harness: Harness) -> None:
    @tidegate_app.task
    def noop() -> None: ...

    tidegate_app.enqueue(noop)
    harness.drain()
    assert harness.enqueued(noop) == []
    with pytest.raises(AssertionError, match="none of it is"):
        harness.assert_enqueued(noop)


# -- drain ----------------------------------------------------------------------------


def test_drain_runs_every_due_run_and_what_they_enqueue_and_returns_them(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    retried: list[int] = []

    @tidegate_app.task
    def child(n: int) -> int:
        return n * 10

    @tidegate_app.task
    async def parent(n: int) -> str:
        await tidegate_app.aenqueue(child, {"n": n})
        return "parent"

    @tidegate_app.task
    def again() -> str:
        retried.append(current_run().attempt)
        if len(retried) == 1:
            raise Retry(0)
        return "again"

    @tidegate_app.task(max_attempts=3)
    def fails() -> None:
        raise ValueError("no")

    @tidegate_app.task
    def later() -> None: ...

    tidegate_app.enqueue(parent, {"n": 1})
    tidegate_app.enqueue(again)
    tidegate_app.enqueue(fails)
    delayed = tidegate_app.enqueue(later, delay=3600)

    runs = harness.drain()

    outcomes = {run.task.rsplit(".", 1)[-1]: run for run in runs}
    assert [run.id for run in runs] == sorted(run.id for run in runs)
    assert set(outcomes) == {"parent", "child", "again", "fails"}
    assert outcomes["parent"].result == "parent"
    assert outcomes["child"].result == 10
    assert outcomes["again"].result == "again" and retried == [1, 2]
    # A failure's retry is scheduled after its backoff (a second at least): not due.
    assert outcomes["fails"].state is RunState.SCHEDULED
    assert outcomes["fails"].errors[0]["error"] == "ValueError: no"
    assert tidegate_app.get_run(delayed.id).state is RunState.SCHEDULED  # type: ignore[union-attr]
    assert harness.drain() == []


async def test_adrain_works_from_async_tests(tidegate_app: Tidegate, harness: Harness) -> None:
    @tidegate_app.task
    async def hello(name: str) -> str:
        return f"hello {name}"

    await tidegate_app.aenqueue(hello, {"name": "a"})
    [run] = await harness.adrain()
    assert (run.state, run.result) == (RunState.SUCCEEDED, "hello a")


def test_drain_fails_a_test_whose_runs_never_end_instead_of_hanging_it(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    @tidegate_app.task
    def again(n: int) -> None:
        tidegate_app.enqueue(again, {"n": n + 1})  # for ever

    tidegate_app.enqueue(again, {"n": 0})
    with pytest.raises(TimeoutError, match=r"drain: runs still due after 1\.0 s"):
        harness.drain(timeout=1.0)
    assert len(tidegate_app.list_runs(state=RunState.SUCCEEDED)) > 1  # it did work them


def test_drain_raises_what_stops_its_worker(database_url: str, schema: str) -> None:
    app = Tidegate(database_url, schema=schema)  # never migrated
    with pytest.raises(SchemaError, match="run `tidegate migrate`"):
        Harness(app).drain()
    app.close()


# -- perform --------------------------------------------------------------------------


def test_perform_gives_the_handler_its_run_and_keeps_its_progress(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    @tidegate_app.task(max_attempts=4)
    def count(to: int) -> dict[str, Any]:
        run = current_run()
        for n in range(to):
            run.progress({"done": n + 1})
        return {"key": run.key, "attempt": run.attempt, "of": run.max_attempts}

    performed = harness.perform(count, {"to": 2}, key="tenant-1")
    assert performed.state is RunState.SUCCEEDED
    assert performed.result == {"key": "tenant-1", "attempt": 1, "of": 4}
    assert performed.progress == [{"done": 1}, {"done": 2}]
    assert performed.error is None


async def test_aperform_has_retry_cancel_discard_and_failure_as_a_worker_has(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    @tidegate_app.task(max_attempts=2)
    async def decide(what: str) -> None:
        await current_run().aprogress(what)
        if what == "retry":
            raise Retry(30)
        if what == "cancel":
            raise Cancel("not wanted")
        if what == "discard":
            raise Discard("refused", details={"status": 422})
        raise RuntimeError("broke")

    retry = await harness.aperform(decide, {"what": "retry"})
    assert (retry.state, retry.delay_seconds, retry.error) == (RunState.SCHEDULED, 30, None)
    assert retry.progress == ["retry"]

    cancel = await harness.aperform(decide, {"what": "cancel"})
    assert cancel.state is RunState.CANCELLED
    assert cancel.error is not None and cancel.error["error"] == "Cancel: not wanted"

    discard = await harness.aperform(decide, {"what": "discard"})
    assert discard.state is RunState.DISCARDED
    assert discard.error is not None and discard.error["details"] == {"status": 422}

    failed = await harness.aperform(decide, {"what": "fail"})
    assert failed.state is RunState.SCHEDULED and failed.delay_seconds > 0
    assert failed.error is not None and failed.error["error"] == "RuntimeError: broke"
    assert "raise RuntimeError" in failed.error["traceback"]

    last = await harness.aperform(decide, {"what": "fail"}, attempt=2)
    assert last.state is RunState.DISCARDED


async def test_aperform_bounds_an_async_handler_by_the_tasks_timeout(
    tidegate_app: Tidegate, harness: Harness
) -> None:
    @tidegate_app.task(timeout=0.05)
    async def stuck() -> None:
        await asyncio.Event().wait()

    performed = await harness.aperform(stuck)
    assert performed.error is not None
    assert performed.error["error"] == "TimeoutError: attempt exceeded 0.05s"


# -- the plugin, as a user's project meets it ------------------------------------------

MYAPP = """
from tidegate import Tidegate

app = Tidegate()


@app.task
def welcome(to: str) -> str:
    return f"welcome {to}"


def signup(email: str) -> None:
    app.enqueue(welcome, {"to": email})
"""


@pytest.fixture
def project(
    pytester: pytest.Pytester, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """A user's project: ``myapp.py``, its pytest.ini naming the app, on this database."""
    monkeypatch.setenv("TIDEGATE_DATABASE_URL", database_url)
    pytester.makepyfile(myapp=MYAPP)
    pytester.makeini("[pytest]\ntidegate_app = myapp:app\n")
    return pytester


def test_the_app_the_ini_names_is_bound_to_a_schema_of_each_tests_own(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_signup=textwrap.dedent(
            """
            import pytest
            import myapp

            @pytest.mark.parametrize("email", ["a@example.com", "b@example.com"])
            def test_signup_welcomes(tidegate_harness, tidegate_app, tidegate_schema, email):
                assert tidegate_app is myapp.app
                assert myapp.app.settings.schema == tidegate_schema
                myapp.signup(email)
                tidegate_harness.assert_enqueued(myapp.welcome, args={"to": email})
                [run] = tidegate_harness.drain()  # only this test's run
                assert run.result == f"welcome {email}"

            def test_the_app_is_put_back_after():
                assert myapp.app.settings.schema == "tidegate"
            """
        )
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_plugin_touches_nothing_when_no_test_asks_for_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database that cannot be reached: nothing may try it.
    monkeypatch.setenv("TIDEGATE_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    pytester.makepyfile(
        "import sys\n\ndef test_plain():\n    assert 'tidegate' not in sys.modules\n"
    )
    result = pytester.runpytest_subprocess("--trace-config", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*_tidegate_pytest*"])  # loaded, by its entry point


def test_the_embedded_server_survives_another_pytest_session_making_its_folders_private(
    tidegate_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """As root, every pytest session that starts makes ``/tmp/pytest-of-root`` private to
    root; an embedded server (an unprivileged user) kept under it then stops at its next
    checkpoint ("could not open pg_control: Permission denied"). Its folder is elsewhere."""
    if os.environ.get("TIDEGATE_DATABASE_URL") or os.geteuid() != 0:
        pytest.skip("only the embedded server of a session run as root")
    base = tmp_path_factory.getbasetemp()
    top = next(folder for folder in (base, *base.parents) if folder.name.startswith("pytest-of-"))
    mode = top.stat().st_mode
    top.chmod(mode & ~0o077)  # what a second pytest session does
    try:
        with psycopg.connect(tidegate_database_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        with psycopg.connect(tidegate_database_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        top.chmod(mode)
