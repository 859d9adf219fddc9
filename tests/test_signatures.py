"""Standard Webhooks signatures against the specification's published test vectors.

The vectors are those every reference library of the specification tests itself with
(github.com/standard-webhooks/standard-webhooks, libraries/python/tests/test_webhooks.py,
the same in its Go and JavaScript libraries): a fixed secret, message id, timestamp and
payload, the signature they give, and the cases a verifier must refuse.
"""

from __future__ import annotations

import pytest

from tidegate.signatures import SignatureError, sign, verify

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
PAYLOAD = b'{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
"""The published signature of ``MSG_ID.TIMESTAMP.PAYLOAD`` under ``SECRET``."""
WRONG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
"""The published invalid signature: the right one with its last byte changed."""
OTHERS = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
TOLERANCE = 5 * 60


def headers(signature: str = SIGNATURE, **changed: str) -> dict[str, str]:
    sent = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": signature,
    }
    return {**sent, **changed}


def test_signing_the_published_message_gives_the_published_signature() -> None:
    assert sign(SECRET, MSG_ID, TIMESTAMP, PAYLOAD) == SIGNATURE


def test_the_published_signature_verifies() -> None:
    verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP)


def test_a_valid_entry_among_others_verifies() -> None:
    """Secret rotation: several space-separated entries, other versions among them."""
    entries = [OTHERS, OTHERS.replace("v1,", "v2,"), SIGNATURE, OTHERS]
    verify(SECRET, headers(" ".join(entries)), PAYLOAD, now=TIMESTAMP)


@pytest.mark.parametrize(
    "sent",
    [
        headers(WRONG),
        headers(OTHERS),
        headers("v1,"),
        headers(SIGNATURE.replace("v1,", "v2,")),
        headers(**{"webhook-timestamp": "hello"}),
        {k: v for k, v in headers().items() if k != "webhook-id"},
        {k: v for k, v in headers().items() if k != "webhook-timestamp"},
        {k: v for k, v in headers().items() if k != "webhook-signature"},
    ],
    ids=[
        "invalid-signature",
        "another-message",
        "empty-signature",
        "unknown-version",
        "invalid-timestamp",
        "missing-id",
        "missing-timestamp",
        "missing-signature",
    ],
)
def test_the_published_bad_requests_are_refused(sent: dict[str, str]) -> None:
    with pytest.raises(SignatureError):
        verify(SECRET, sent, PAYLOAD, now=TIMESTAMP)


@pytest.mark.parametrize("drift", [-(TOLERANCE + 1), TOLERANCE + 1], ids=["old", "new"])
def test_a_timestamp_past_the_five_minute_tolerance_is_refused(drift: int) -> None:
    """The libraries' old and new timestamp cases: signed correctly, received five
    minutes and a second away."""
    with pytest.raises(SignatureError, match="5 minutes"):
        verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP - drift)
    verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP - drift + (1 if drift > 0 else -1))


def test_a_changed_payload_id_or_timestamp_is_refused() -> None:
    for sent, body in [
        (headers(), PAYLOAD.replace(b" ", b"")),  # re-serialized JSON: another payload
        (headers(**{"webhook-id": "msg_other"}), PAYLOAD),
        (headers(**{"webhook-timestamp": str(TIMESTAMP + 1)}), PAYLOAD),
    ]:
        with pytest.raises(SignatureError, match="no webhook-signature entry matches"):
            verify(SECRET, sent, body, now=TIMESTAMP)
