"""The HTTP API of an API process (``tidegate serve``): webhooks in, the runs, admin and
metrics APIs, the remote workers' protocol, health checks.

Three layers, each importing only the one below it and the library (tidegate's domain,
worker and storage modules, which import none of them):

- the assembler, ``server.py``: ``create_server`` puts the routers, the ``Guard`` and
  the dashboard (``tidegate.ui.install``) together. Nothing but ``tidegate serve`` and
  the tests imports it.
- the routers, one per surface: ``hooks.py`` (``POST /hooks/{token}``), ``runs.py``,
  ``admin.py``, ``workers.py`` (the remote workers' protocol and their tokens),
  ``metrics.py``, ``health.py``. A router imports the kernel, the parts below and the
  library, never another router; the dashboard's pages (``tidegate.ui``) are routers
  too, under the same rule.
- the kernel, ``kernel.py``: the API process's state (``Api``: settings, pool,
  listeners, waiting claims, streams, ledger, rescuer, trigger cache), the problem
  answers and the responses every route documents. It imports no router. Beside it,
  the parts the state holds or the routes share: ``guard.py`` (what every request
  meets first, the dashboard's session included), ``auth.py`` (bearer tokens),
  ``claims.py`` (remote workers' waiting claims), ``completions.py`` (the completion
  listener), ``streams.py`` and ``events.py`` (live progress), ``ledger.py`` (webhook
  answers, counted), ``protocol.py`` (uvicorn's parser, bounded).

What the routes, the dashboard and the CLI do alike to the database is a ``Steps``
operation of the library (``tidegate.runs``, ``figures``, ``access``, ``webhooks``,
``projects``, ``policies``, ``schedules``, ``remote``); a router keeps the statements
only it runs. tests/test_layout.py checks the layers from the imports.
"""
