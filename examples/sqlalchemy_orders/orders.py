"""An order and its receipt committed together: a SQLAlchemy 2 session (psycopg driver)
enqueues the receipt's run in the session's own transaction.

The session's transaction is one psycopg connection's: ``session.connection()`` is the
SQLAlchemy ``Connection`` the session's transaction runs on, its ``.connection`` the
pool's proxy for the psycopg connection, and ``.driver_connection`` the
``psycopg.Connection`` itself, which ``enqueue(..., connection=)`` takes. The run then
commits with the order, or vanishes with it.
"""

from __future__ import annotations

import os

from sqlalchemy import CheckConstraint, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from tidegate import Tidegate

app = Tidegate()  # TIDEGATE_DATABASE_URL: tidegate's schema may share the shop's database
engine = create_engine(os.environ.get("SHOP_DATABASE_URL", "postgresql+psycopg://localhost/shop"))


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = (CheckConstraint("total > 0", name="orders_total_positive"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total: Mapped[int]


@app.task
def send_receipt(order_id: int, email: str) -> str:
    return f"receipt for order {order_id} sent to {email}"


def place_order(order_id: int, email: str, total: int) -> None:
    """Store an order and enqueue its receipt: both, or (if the commit fails) neither."""
    with Session(engine) as session, session.begin():  # commits at the block's end
        session.add(Order(id=order_id, email=email, total=total))
        psycopg_connection = session.connection().connection.driver_connection
        app.enqueue(
            send_receipt, {"order_id": order_id, "email": email}, connection=psycopg_connection
        )
