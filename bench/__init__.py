"""tidegate's benchmark: the same workloads on tidegate, a raw-SQL queue and the peers.

Run it with ``python bench/run.py`` (see ``docs/benchmarks.md``). The package is:

- ``run``: the command line, the order of the measurements, the report;
- ``driver``: the workloads, measured the same way on every system;
- ``systems``: one adapter per system (``base`` is the contract), the raw-SQL queue's
  included, and the environment each peer runs in;
- ``envs``: the peers' virtual environments, made from PyPI;
- ``http``: the webhook path (tidegate only);
- ``harness``: what they share (worker processes, percentiles, descriptions, results).
"""
