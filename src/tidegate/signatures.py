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
import re
import time
from collections.abc import Mapping

TOLERANCE_SECONDS = 5 * 60
SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
TIMESTAMP = re.compile(r"[0-9]{1,12}")
"""Unix seconds, digits only: no sign, no spaces, no underscores, no overflow."""


class SignatureError(ValueError):
    """The request's signature headers are missing, stale or do not match."""


class MisconfiguredSecret(SignatureError):
    """The trigger's own secret is not a valid one (stored before secrets were checked)."""


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
    if not TIMESTAMP.fullmatch(timestamp):
        raise SignatureError("webhook-timestamp must be Unix seconds")
    sent_at = int(timestamp)
    if abs((time.time() if now is None else now) - sent_at) > TOLERANCE_SECONDS:
        raise SignatureError("webhook-timestamp is more than 5 minutes from now")
    expected = sign(secret, webhook_id, sent_at, body).encode()
    for entry in signatures.split():
        if hmac.compare_digest(entry.encode(), expected):
            return
    raise SignatureError("no webhook-signature entry matches")


def check_secret(secret: str) -> str:
    """Return ``secret`` if it is a Standard Webhooks secret, else raise ``ValueError``.

    ``whsec_`` and the base64 of 24 to 64 random bytes. Checked when a trigger is
    created or changed, so a sender never meets a misconfigured trigger.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with 'whsec_'")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a signing secret is 'whsec_' + base64, and this is not base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"a signing secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
            f" (before base64), this one {len(key)}"
        )
    return secret


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(check_secret(secret).removeprefix(SECRET_PREFIX), validate=True)
    except ValueError as error:
        raise MisconfiguredSecret(str(error)) from None
