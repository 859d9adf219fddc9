"""``GET /metrics``: the cluster's figures in Prometheus' text format, read at scrape time.

Every figure is read from PostgreSQL when Prometheus asks (``tidegate.figures``:
``read_figures``), so every API process reports the same ones; each statement's cost is
bounded whatever the number of runs, lanes or projects (docs/metrics.md says how each
figure is computed, what it costs, how exact it is). This module writes them out, with
the ``process_*`` and ``python_*`` series of the API process that answers.

The route needs the super admin's token (the ``Guard`` checks it): the figures name
projects.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate

from fastapi import APIRouter, Request, Security
from fastapi.responses import Response
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tidegate.api.auth import BEARER
from tidegate.api.kernel import AUTH_RESPONSES, Api
from tidegate.figures import WAITING_CAP, Attempts, Figures, KeyFigures, read_figures
from tidegate.worker.counters import CLAIMED, DURATION_BUCKETS, Tally

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' classic text format, which every version reads: the names and labels
here are all plain ones, so ``generate_latest`` writes exactly that."""

router = APIRouter(tags=["metrics"], dependencies=[Security(BEARER)], responses=AUTH_RESPONSES)


class FiguresCollector(Collector):
    """The metric families of one scrape's ``Figures``."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def collect(self) -> Iterable[Metric]:
        figures = self.figures
        runs = GaugeMetricFamily(
            "tidegate_runs",
            "Runs in a lane by state (exact up to 10,000 per lane and state, estimated above).",
            labels=["lane", "state"],
        )
        lag = GaugeMetricFamily(
            "tidegate_lane_lag_seconds",
            "How long the lane's oldest available run has been due (0: none available).",
            labels=["lane"],
        )
        paused = GaugeMetricFamily(
            "tidegate_lane_paused",
            "1 while the lane is paused (its runs are not claimed), else 0.",
            labels=["lane"],
        )
        for lane in figures.lanes:
            for state, count in lane.depth.items():
                runs.add_metric([lane.lane, state], count)
            lag.add_metric([lane.lane], lane.lag_seconds)
            paused.add_metric([lane.lane], 1 if lane.paused else 0)
        yield runs
        yield lag
        yield paused
        yield GaugeMetricFamily(
            "tidegate_workers_live",
            "Workers whose last heartbeat is within three heartbeat intervals.",
            value=figures.workers_live,
        )
        yield GaugeMetricFamily(
            "tidegate_worker_heartbeat_age_seconds",
            "Seconds since the least recent heartbeat of a live worker (0: no live worker).",
            value=figures.heartbeat_age_seconds,
        )
        slots = GaugeMetricFamily(
            "tidegate_workloop_slots",
            "Slots of the live workers' workloops, by lane chain.",
            labels=["chain"],
        )
        busy = GaugeMetricFamily(
            "tidegate_workloop_busy",
            "Busy slots of the live workers' workloops at their last heartbeat, by lane chain.",
            labels=["chain"],
        )
        for loop in figures.workloops:
            slots.add_metric([loop.chain], loop.slots)
            busy.add_metric([loop.chain], loop.busy)
        yield slots
        yield busy
        in_flight = GaugeMetricFamily(
            "tidegate_fast_lane_in_flight",
            "A project's fast-lane runs in flight (the busiest projects only).",
            labels=["project"],
        )
        cap = GaugeMetricFamily(
            "tidegate_fast_lane_cap",
            "A project's fast-lane cap (the busiest projects only).",
            labels=["project"],
        )
        for project in figures.projects:
            in_flight.add_metric([project.project], project.fast_lane_in_flight)
            cap.add_metric([project.project], project.fast_lane_cap)
        yield in_flight
        yield cap
        callers = GaugeMetricFamily(
            "tidegate_waiting_callers",
            "Callers refused by a project's limit that hold a place in its waiting room "
            "(the longest lines only).",
            labels=["project", "limit"],
        )
        wait = GaugeMetricFamily(
            "tidegate_waiting_seconds",
            "The predicted wait of a project's waiting room for a limit: seconds until the "
            "last place in line is due (the longest lines only).",
            labels=["project", "limit"],
        )
        for line in figures.waiting:
            callers.add_metric([line.project, line.limit], line.callers)
            wait.add_metric([line.project, line.limit], line.wait_seconds)
        yield callers
        yield wait
        yield from _attempt_families(figures.attempts)
        yield from _key_families(figures.keys)
        schedules = GaugeMetricFamily(
            "tidegate_schedules",
            "Schedules by state: active, paused, failing (the last tick made no run).",
            labels=["state"],
        )
        for state, count in figures.schedules.items():
            schedules.add_metric([state], count)
        yield schedules
        yield GaugeMetricFamily(
            "tidegate_schedule_lag_seconds",
            "How long the most overdue active schedule's tick has been due (0: none is): "
            "no live worker has its task, or none fires.",
            value=figures.schedule_lag_seconds,
        )
        webhooks = CounterMetricFamily(
            "tidegate_webhooks",
            "Webhooks answered, by project, trigger mode, outcome and HTTP status (the "
            "busiest projects; the others as '(other)'; up to a second behind).",
            labels=["project", "mode", "outcome", "status"],
        )
        for answers in figures.webhooks:
            webhooks.add_metric(
                [answers.project, answers.mode, answers.outcome, str(answers.status)],
                answers.requests,
            )
        yield webhooks
        yield histogram(
            "tidegate_webhook_answer_seconds",
            "Time to answer a webhook, by trigger mode and outcome; a sync trigger's "
            "admitted requests: the round trip, the run included (up to a second behind).",
            ["mode", "outcome"],
            figures.answer_times,
        )


def _key_families(keys: list[KeyFigures]) -> Iterable[Metric]:
    """The busiest keys' runs in flight and waiting, their cap, what holds them, and the
    ordered keys stuck behind their front run, by lane."""
    labels = ["lane", "key"]
    in_flight = GaugeMetricFamily(
        "tidegate_key_in_flight",
        "A key's runs in flight in the lane (the busiest keys).",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "tidegate_key_waiting",
        f"A key's available runs in the lane, counted up to {WAITING_CAP} (the busiest keys).",
        labels=labels,
    )
    cap = GaugeMetricFamily(
        "tidegate_key_max_running",
        "A key's max_running in the lane, its own or the lane's default (keys that have one).",
        labels=labels,
    )
    held = GaugeMetricFamily(
        "tidegate_key_held",
        "1 when a key's runs wait for its limit (by: breaker, order, cap, rate), else 0 "
        "(the busiest keys).",
        labels=[*labels, "by"],
    )
    blocked = GaugeMetricFamily(
        "tidegate_ordered_keys_blocked",
        "Ordered keys whose runs wait behind a front run that cannot start now: backing "
        "off to retry, delayed, or pending (among the busiest keys).",
        labels=["lane"],
    )
    blocked_by_lane: dict[str, int] = {}
    for key in keys:
        names = [key.lane, key.key]
        in_flight.add_metric(names, key.in_flight or 0)
        waiting.add_metric(names, key.waiting or 0)
        if key.max_running is not None:
            cap.add_metric(names, key.max_running)
        for limit in ("breaker", "order", "cap", "rate"):
            held.add_metric([*names, limit], int(key.held_by == limit))
        if key.ordered:
            blocked_by_lane[key.lane] = blocked_by_lane.get(key.lane, 0) + key.blocked
    for lane, count in sorted(blocked_by_lane.items()):
        blocked.add_metric([lane], count)
    yield from (in_flight, waiting, cap, held, blocked)


def _attempt_families(series: list[Attempts]) -> Iterable[Metric]:
    """The finished attempts by (task, lane, outcome), their handler times by task, and
    the waits from due to claimed by lane (worker/counters.py)."""
    attempts = CounterMetricFamily(
        "tidegate_attempts",
        "Attempts finished, by task, lane and outcome (up to one heartbeat behind).",
        labels=["task", "lane", "outcome"],
    )
    by_task: dict[tuple[str, ...], Tally] = {}
    by_lane: dict[tuple[str, ...], Tally] = {}
    for one in series:
        tally = Tally(DURATION_BUCKETS, one.attempts, one.seconds, one.buckets)
        if one.outcome == CLAIMED:
            by_lane.setdefault((one.lane,), Tally()).add(tally)
            continue
        attempts.add_metric([one.task, one.lane, one.outcome], one.attempts)
        by_task.setdefault((one.task,), Tally()).add(tally)
    yield attempts
    yield histogram(
        "tidegate_run_duration_seconds",
        "Handler time of the attempts finished, by task (up to one heartbeat behind).",
        ["task"],
        by_task,
    )
    yield histogram(
        "tidegate_claim_wait_seconds",
        "How long claimed runs waited from due to claimed, by lane (up to one heartbeat behind).",
        ["lane"],
        by_lane,
    )


def histogram(
    name: str, documentation: str, labels: list[str], tallies: dict[tuple[str, ...], Tally]
) -> Metric:
    """A histogram family from tallies by label values (their buckets not cumulative)."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, tally in tallies.items():
        bounds = [str(bound) for bound in tally.bounds] + ["+Inf"]
        family.add_metric(
            list(values),
            list(zip(bounds, accumulate(tally.buckets), strict=True)),
            sum_value=tally.seconds,
        )
    return family


PROCESS = CollectorRegistry(auto_describe=False)
"""prometheus-client's own series of the process that answers the scrape (the
``process_*`` CPU, memory, file descriptors and start time, ``python_info``,
``python_gc_*``), as every Python exporter has them: per API process, unlike the
cluster's figures."""
ProcessCollector(registry=PROCESS)
PlatformCollector(registry=PROCESS)
GCCollector(registry=PROCESS)


def exposition(figures: Figures) -> bytes:
    """Render ``figures``, then the answering process's own series (``PROCESS``), in
    Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(figures))
    return generate_latest(registry) + generate_latest(PROCESS)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format", "content": {CONTENT_TYPE: {}}}},
    operation_id="getMetrics",
)
async def metrics(request: Request) -> Response:
    """The cluster's figures for Prometheus (the super admin's token)."""
    api: Api = request.app.state.api
    figures = await api.run(read_figures(api.settings))
    return Response(exposition(figures), media_type=CONTENT_TYPE)
