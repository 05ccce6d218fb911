"""Callback URL rules, the host allow-list, and the delivery signature a receiver checks."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

import pytest

from ffdl.core.errors import BadRequest
from ffdl.server.services.webhooks import (
    HostPolicy,
    check_callback_host,
    check_callback_url,
    new_secret,
    signature,
    verify_signature,
)


def addr(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.7",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
    ],
)
def test_the_default_admits_no_internal_address(address: str) -> None:
    policy = HostPolicy(["public"])
    assert not policy.admits_address(addr(address))
    assert policy.refusal("hooks.example.com", [addr(address)]) is not None


def test_the_default_admits_public_addresses_only_when_all_are_public() -> None:
    policy = HostPolicy(["public"])
    assert policy.refusal("hooks.example.com", [addr("8.8.8.8"), addr("2001:4860::8888")]) is None
    refusal = policy.refusal("hooks.example.com", [addr("8.8.8.8"), addr("10.0.0.1")])
    assert refusal is not None and "10.0.0.1" in refusal
    assert "does not resolve" in str(policy.refusal("nowhere.example", []))


def test_listed_names_suffixes_and_networks() -> None:
    policy = HostPolicy(["hooks.corp.example", "*.ci.example", "10.20.0.0/16", "::1"])
    assert not policy.public
    assert policy.refusal("hooks.corp.example", [addr("10.9.9.9")]) is None  # by name
    assert policy.refusal("HOOKS.corp.example.", []) is None
    assert policy.refusal("a.ci.example", [addr("192.168.0.1")]) is None
    assert policy.refusal("ci.example", [addr("192.168.0.1")]) is not None
    assert policy.refusal("other.example", [addr("10.20.3.4")]) is None  # by network
    assert policy.refusal("other.example", [addr("10.21.3.4")]) is not None
    assert policy.refusal("other.example", [addr("8.8.8.8")]) is not None  # no 'public'
    assert policy.refusal("::1", [addr("::1")]) is None


def test_a_malformed_allow_list_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="webhook_allowed_hosts"):
        HostPolicy(["public", "http://x/"])


def refused(url: object, policy: HostPolicy) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        check_callback_url(url, policy)
    assert caught.value.detail["field"] == "url"
    return caught.value


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (None, "required"),
        (42, "required"),
        ("gopher://h.example/", "http or https"),
        ("//h.example/x", "http or https"),
        ("https://u:secret@h.example/", "credentials"),
        ("https://token@h.example/", "credentials"),
        ("https:///path", "no host"),
        ("https://h.example:0x1/", "invalid port"),
        ("https://h.example/\nx", "control characters"),
        ("https://h.example/" + "x" * 3000, "over 2048"),
        ("http://127.0.0.1/", "does not admit"),
        ("http://[::ffff:169.254.169.254]/", "does not admit"),
    ],
)
def test_bad_urls_are_refused_naming_the_url(url: object, words: str) -> None:
    error = refused(url, HostPolicy(["public"]))
    assert words in error.message
    assert "secret" not in error.message and "secret" not in str(error.detail)


def test_good_urls_give_host_and_port() -> None:
    policy = HostPolicy(["public"])
    assert check_callback_url("https://hooks.example.com/x?y=1", policy) == (
        "hooks.example.com",
        443,
    )
    assert check_callback_url("HTTP://8.8.8.8:8080/", policy) == ("8.8.8.8", 8080)
    assert check_callback_url("http://127.0.0.1:9/", HostPolicy(["127.0.0.1"])) == (
        "127.0.0.1",
        9,
    )


def test_an_empty_allow_list_turns_webhooks_off() -> None:
    assert "turned off" in refused("https://hooks.example.com/", HostPolicy([])).message


def test_a_name_resolving_to_loopback_is_refused_by_default() -> None:
    with pytest.raises(BadRequest, match="does not admit"):
        check_callback_host("http://localhost/", "localhost", 80, HostPolicy(["public"]))
    check_callback_host("http://localhost/", "localhost", 80, HostPolicy(["localhost"]))


def test_the_signature_is_hmac_sha256_over_timestamp_and_body() -> None:
    secret = new_secret()
    body = b'{"event_id":1}'
    expected = hmac.new(secret.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(secret, 1700000000, body) == "v1=" + expected


def test_a_receiver_refuses_replays_tampering_and_other_secrets() -> None:
    secret, body, now = new_secret(), b'{"event_id":7}', 1_700_000_000.0
    sig = signature(secret, int(now), body)
    assert verify_signature(secret, str(int(now)), sig, body, now + 10)
    assert not verify_signature(secret, str(int(now)), sig, body, now + 3600)  # replayed late
    assert not verify_signature(secret, str(int(now) + 1), sig, body, now)  # timestamp changed
    assert not verify_signature(secret, str(int(now)), sig, body + b" ", now)
    assert not verify_signature(new_secret(), str(int(now)), sig, body, now)
    assert not verify_signature(secret, "soon", sig, body, now)
    assert new_secret() != new_secret()
