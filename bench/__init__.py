"""tidegate's benchmark: tidegate against a minimal raw-SQL queue, on the same database.

Run it with ``python bench/run.py`` (see ``docs/benchmarks.md``). The package is:

- ``run``: the command line, the order of the measurements, the report;
- ``raw``: the raw-SQL queue (one table, one index, three statements) and its worker;
- ``tidegate_side``: the same workloads driven through tidegate's public API;
- ``apps``: the no-op tidegate app that the worker process loads;
- ``harness``: what both sides share (schemas, worker processes, percentiles).
"""
