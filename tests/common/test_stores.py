"""Store URLs: Redis through Sentinel, PostgreSQL at several hosts (common.stores)."""

from __future__ import annotations

import pytest

from common.stores import (
    SentinelTarget,
    is_sentinel,
    parse_sentinel,
    postgres_hosts,
    without_password,
)


def test_sentinels_are_read_with_the_first_urls_database_and_password() -> None:
    url = "sentinel://:s%40cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380/2;sentinel://h3"

    assert is_sentinel(url)
    assert not is_sentinel("redis://h:6379/0")
    assert parse_sentinel(url) == SentinelTarget(
        (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("h3", 26379)), 2, None, "s@cret"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sentinel://h1:26379;redis://h2:6379", "is not a sentinel:// URL"),
        ("sentinel://h1:port", "has no valid port"),
        ("sentinel://h1:26379/zero", "the database must be a number"),
        ("sentinel://:26379", "names no host"),
        (";", "no Sentinel given"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_saying_why(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sentinel(url)


@pytest.mark.parametrize(
    "url",
    [
        "sentinel://:hunter2pw@h1:26379/0;redis://:hunter2pw@h2:6379",
        "sentinel://app:hunter2pw@h1:port/0",
        "sentinel://:hunter2pw@h1:26379/zero",
        "sentinel://:hunter2pw@:26379",
        "sentinel://:hun@ter2pw@h1:port",
    ],
)
def test_a_malformed_sentinel_urls_error_never_repeats_its_password(url: str) -> None:
    with pytest.raises(ValueError, match=r":\*\*\*@") as refused:
        parse_sentinel(url)

    assert "ter2pw" not in str(refused.value)


def test_a_url_is_shown_without_its_passwords() -> None:
    assert without_password("sentinel://:p%40ss@s1:26379/0;sentinel://u:pw@s2:26379/0") == (
        "sentinel://:***@s1:26379/0;sentinel://u:***@s2:26379/0"
    )
    assert without_password("redis://user@h:6379/0") == "redis://user@h:6379/0"
    assert without_password("redis://h:6379/0") == "redis://h:6379/0"


def test_several_postgresql_hosts_become_libpqs_lists() -> None:
    hosts = postgres_hosts("postgres://app:pw@db1:5432,db2,[fd00::3]:6432/orch?sslmode=require")

    assert hosts is not None
    assert (hosts.host, hosts.port) == ("db1,db2,fd00::3", "5432,5432,6432")
    assert hosts.single_url == "postgres://app:pw@db1:5432/orch?sslmode=require"
    assert postgres_hosts("postgres://app@db1:5432/orch") is None


@pytest.mark.parametrize(
    ("url", "message"),
    [("postgres://a@db1,:5432/x", "empty host"), ("postgres://a@db1:x,db2/x", "not a number")],
)
def test_a_malformed_host_list_is_refused_saying_why(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        postgres_hosts(url)
