"""The shop's tidegate app, its task, and the order that enqueues it in Django's
transaction.

Inside ``transaction.atomic()``, Django's connection runs one psycopg 3 transaction:
``django.db.connection.connection`` is that ``psycopg.Connection`` (Django's
``postgresql`` backend on psycopg 3), which ``enqueue(..., connection=)`` takes. The run
then commits with the block, or vanishes when it rolls back.
"""

from __future__ import annotations

from django.db import connection, transaction

from orders.models import Order
from tidegate import Tidegate

app = Tidegate()  # TIDEGATE_DATABASE_URL: tidegate's schema may share the shop's database


class OutOfStock(Exception):
    pass


@app.task
def send_receipt(order_id: int, email: str) -> str:
    return f"receipt for order {order_id} sent to {email}"


def place_order(email: str, total: int, *, in_stock: bool = True) -> Order:
    """Store an order and enqueue its receipt: both, or (if anything fails) neither."""
    with transaction.atomic():
        order = Order.objects.create(email=email, total=total)
        app.enqueue(
            send_receipt,
            {"order_id": order.id, "email": email},
            connection=connection.connection,  # the psycopg connection atomic() runs on
        )
        if not in_stock:
            raise OutOfStock(f"order {order.id}")  # atomic() rolls both back
    return order
