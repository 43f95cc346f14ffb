"""Real SSH keys, made for each test by ``cryptography``: the public line as a .pub file holds it."""

from __future__ import annotations

import warnings
from functools import cache

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.utils import CryptographyDeprecationWarning


def ed25519_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def ecdsa_key(curve: ec.EllipticCurve | None = None) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(curve or ec.SECP256R1())


@cache
def rsa_key(bits: int = 2048) -> rsa.RSAPrivateKey:
    # Cached per size: generating RSA keys is the slow part of these tests, and no test needs two alike.
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def dsa_key() -> dsa.DSAPrivateKey:
    return dsa.generate_private_key(key_size=1024)  # noqa: S505 - made weak to be refused


def public_line(key: PrivateKeyTypes, comment: str = "") -> str:
    with warnings.catch_warnings():
        # Writing a DSA key in OpenSSH's format is deprecated; the tests make one to see it refused.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    text = line.decode("ascii")
    return f"{text} {comment}" if comment else text


def private_openssh(key: PrivateKeyTypes) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode("ascii")


def private_pem(key: PrivateKeyTypes) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")
