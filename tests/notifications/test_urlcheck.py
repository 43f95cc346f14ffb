from __future__ import annotations

import pytest

from controlplane.notifications import urlcheck


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://localhost:8080/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://100.64.0.1/hook",  # shared address space (carrier-grade NAT)
        "http://0.0.0.0/hook",
        "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped loopback
        "http://[fe80::1]/hook",
        "http://[fc00::1]/hook",
        "http://224.0.0.1/hook",
        "http://240.0.0.1/hook",
    ],
)
def test_private_loopback_link_local_and_reserved_addresses_are_refused(url: str, settings) -> None:  # type: ignore[no-untyped-def]
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(urlcheck.UrlRefused, match="webhooks are sent only to public addresses"):
        urlcheck.resolve(url)


def test_a_public_address_is_allowed_and_is_what_the_delivery_connects_to(settings) -> None:  # type: ignore[no-untyped-def]
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    target = urlcheck.resolve("https://93.184.215.14:8443/in?x=1")
    assert (target.scheme, target.address, target.port, target.path) == ("https", "93.184.215.14", 8443, "/in?x=1")


def test_the_operator_may_allow_private_addresses(settings) -> None:  # type: ignore[no-untyped-def]
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = True
    assert urlcheck.resolve("http://127.0.0.1:9/hook").address == "127.0.0.1"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://93.184.215.14/x", "Only http and https"),
        ("http:///x", "no host"),
        ("http://user:pw@93.184.215.14/x", "credentials"),
        ("http://93.184.215.14:99999/x", "port"),
        ("http://no-such-host.invalid/x", "does not resolve"),
        ("http://[::1/x", "not a URL"),
        ("http://" + "a" * 300 + "/x", "does not resolve"),
    ],
)
def test_malformed_urls_are_refused_with_a_reason(url: str, why: str) -> None:
    with pytest.raises(urlcheck.UrlRefused, match=why):
        urlcheck.resolve(url)
