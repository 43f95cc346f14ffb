from __future__ import annotations

import base64

from controlplane.notifications import signing

# The example of the Standard Webhooks reference libraries' tests.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_specifications_example() -> None:
    assert signing.sign(SECRET, msg_id=MSG_ID, timestamp=TIMESTAMP, body=BODY) == EXPECTED


def test_a_new_secret_is_whsec_and_24_random_bytes() -> None:
    secret = signing.new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 24
    assert secret != signing.new_secret()


def test_rotation_header_carries_one_signature_per_secret_separated_by_spaces() -> None:
    other = signing.new_secret()
    header = signing.signature_header([SECRET, other], msg_id=MSG_ID, timestamp=TIMESTAMP, body=BODY)
    first, second = header.split(" ")
    assert first == EXPECTED
    assert second == signing.sign(other, msg_id=MSG_ID, timestamp=TIMESTAMP, body=BODY)
    for secret in (SECRET, other):
        assert signing.verify(
            secret, msg_id=MSG_ID, timestamp=str(TIMESTAMP), signature=header, body=BODY, now=TIMESTAMP
        )


def test_verify_refuses_a_changed_body_a_wrong_secret_and_a_stale_timestamp() -> None:
    header = signing.sign(SECRET, msg_id=MSG_ID, timestamp=TIMESTAMP, body=BODY)
    kw = {"msg_id": MSG_ID, "timestamp": str(TIMESTAMP), "signature": header}
    assert not signing.verify(SECRET, body=BODY + b" ", now=TIMESTAMP, **kw)
    assert not signing.verify(signing.new_secret(), body=BODY, now=TIMESTAMP, **kw)
    assert not signing.verify(SECRET, body=BODY, now=TIMESTAMP + signing.TOLERANCE_S + 1, **kw)
    assert not signing.verify(
        SECRET, body=BODY, now=TIMESTAMP, msg_id="msg_other", timestamp=str(TIMESTAMP), signature=header
    )
