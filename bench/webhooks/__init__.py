"""The webhook path, measured: ``POST /hooks/{token}`` over real HTTP, on one database.

::

    python -m bench.webhooks               # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python -m bench.webhooks --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.webhooks --smoke       # a few requests of each part: checks, not figures
    python -m bench.webhooks --write-docs  # measure, then rewrite docs/benchmarks.md's figures

Every part runs on a fresh schema with its own processes, started as a user would start
them: ``python -m tidegate serve --role api`` (``--api-processes N``) and ``python -m
tidegate worker --app tidegate.builtin:app --workloops "fast_lane:4 manual>*:4"``, with
tidegate's default settings. The client is this process: httpx over loopback TCP,
keep-alive connections opened before the clock starts. Each part is repeated
``--repeat`` times (default 3); a figure is the median of the repetitions, min and max.

1. ``sync``: a sync trigger running ``tidegate.echo``, one API process. (a) Open loop at
   ``--rate`` (100 req/s) for 10 s: requests leave on a fixed schedule whether or not
   earlier ones were answered; p50/p95/p99 of the time the caller waits, the replies
   slower than the send interval, and the time split into stages from the run's own
   timestamps. ``GET /healthz`` at the same rate is the HTTP floor. (b) A burst of 200
   requests at once (project cap 200): every status, and the wait of the 200s. (c) The
   control: (a) and the floor again with a minimal HTTP/1.1 client (``PlainClient``), to
   tell the client's cost from the server's on two shared cores.
2. ``admission``: the ``admit_webhook`` statement that the API runs, called directly with
   psycopg on one connection, paced, in the fast lane (cap 10, live worker) and the
   default lane: p50/p99 of the call as the client sees it (round trip and commit
   included); then the same calls rolled back (the decision alone: no commit, no
   NOTIFY); beside them ``SELECT 1`` and the trigger lookup. ``cap``: a burst of 200
   clients on 3 API processes against a project capped at 3 fast-lane runs whose
   handler sleeps 0.2 s; each client retries on 429/503 for 6 s. Over-admission is read
   from the runs table: the most fast-lane runs running at once (``attempted_at`` to
   ``completed_at``), and the most in flight seen by a sampler polling every 5 ms.
3. ``ingest``: accepted (202, durable) webhooks per second on 2 API processes, driven by
   ``--ingest-clients`` (16) concurrent httpx clients sending ``--ingest-requests``
   (5,000) in all, no worker running; beside it, in the same repetition and on
   tidegate's own tables, the raw-SQL floor: the same request row and run row per
   webhook, one transaction each, two single-row INSERTs, from as many connections. The
   control: the same ingest from as many minimal HTTP/1.1 clients.

Nothing counts unless the database agrees: every accepted webhook must have its run and
its request row (and a sync reply its succeeded run and the echo of its body), and a
rejected one nothing. Results go to ``bench/results/http-latest.json`` and
``bench/results/http-postgres<major>[-embedded].json``; ``--write-docs`` renders every
``http-postgres*.json`` into ``docs/benchmarks.md`` between its ``bench:http`` markers.
"""

import importlib.util
import sys

if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    # httpcore imports sniffio inside a function it calls several times per request, and
    # falls back to asyncio when it is missing (anyio >= 4.11 no longer installs it).
    # Python does not remember a failed import, so each call searched sys.path again:
    # ~14% of this client's CPU (encode/httpcore#1103). ``None`` in sys.modules makes the
    # import fail at once, with the same outcome.
    sys.modules["sniffio"] = None  # type: ignore[assignment]
