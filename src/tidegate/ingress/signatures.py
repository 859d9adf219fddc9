"""Standard Webhooks signatures (https://www.standardwebhooks.com).

A signed request carries ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
``webhook-signature``: space-separated ``v1,<base64 HMAC-SHA256>`` entries over
``{id}.{timestamp}.{raw body}``, keyed with the base64 part of a ``whsec_`` secret.
Several entries allow rotating secrets. Timestamps more than five minutes away from now
are refused, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

TOLERANCE_SECONDS = 5 * 60


class SignatureError(ValueError):
    """The request's signature headers are missing, stale or do not match."""


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``v1,<base64>`` signature of a payload (what a sender computes)."""
    key = _key(secret)
    message = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
    """Raise ``SignatureError`` unless ``headers`` carry a valid signature of ``body``."""
    webhook_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not webhook_id or not timestamp or not signatures:
        raise SignatureError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise SignatureError("webhook-timestamp must be Unix seconds") from None
    if abs((time.time() if now is None else now) - sent_at) > TOLERANCE_SECONDS:
        raise SignatureError("webhook-timestamp is more than 5 minutes from now")
    expected = sign(secret, webhook_id, sent_at, body).encode()
    for entry in signatures.split():
        if hmac.compare_digest(entry.encode(), expected):
            return
    raise SignatureError("no webhook-signature entry matches")


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise SignatureError("the trigger's secret is not valid base64") from None
