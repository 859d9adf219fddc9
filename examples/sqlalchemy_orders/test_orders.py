"""The orders' tests, with tidegate's pytest fixtures (pytest.ini names the app)."""

from __future__ import annotations

from collections.abc import Iterator

import orders
import pytest
from sqlalchemy import exc, func, select
from sqlalchemy.orm import Session

from tidegate import RunState
from tidegate.testing import Harness


@pytest.fixture(autouse=True)
def tables() -> Iterator[None]:
    orders.Base.metadata.create_all(orders.engine)
    yield
    orders.Base.metadata.drop_all(orders.engine)


def test_a_committed_order_has_its_receipt_run_and_it_runs(tidegate_harness: Harness) -> None:
    orders.place_order(1, "a@example.com", total=30)

    tidegate_harness.assert_enqueued(orders.send_receipt, args={"order_id": 1})
    [run] = tidegate_harness.drain()
    assert run.state == RunState.SUCCEEDED
    assert run.result == "receipt for order 1 sent to a@example.com"


def test_an_order_that_fails_to_commit_leaves_no_run(tidegate_harness: Harness) -> None:
    with pytest.raises(exc.IntegrityError, match="orders_total_positive"):
        orders.place_order(2, "b@example.com", total=0)  # fails at the commit's flush

    assert tidegate_harness.enqueued() == []
    with Session(orders.engine) as session:
        assert session.scalar(select(func.count()).select_from(orders.Order)) == 0
