"""The shop's tests, with tidegate's pytest fixtures (pytest.ini names the app)."""

from __future__ import annotations

import pytest
from orders.models import Order
from orders.tasks import OutOfStock, place_order, send_receipt

from tidegate import RunState
from tidegate.testing import Harness


def test_a_committed_order_has_its_receipt_run_and_it_runs(tidegate_harness: Harness) -> None:
    order = place_order("a@example.com", total=30)

    tidegate_harness.assert_enqueued(send_receipt, args={"order_id": order.id})
    [run] = tidegate_harness.drain()
    assert run.state == RunState.SUCCEEDED
    assert run.result == f"receipt for order {order.id} sent to a@example.com"


def test_a_rolled_back_order_leaves_no_run(tidegate_harness: Harness) -> None:
    with pytest.raises(OutOfStock):
        place_order("b@example.com", total=30, in_stock=False)

    assert tidegate_harness.enqueued() == []
    assert not Order.objects.filter(email="b@example.com").exists()
