"""The open event streams of an organization, counted for its quota
(common/eventstreams.py, ``StreamLease``) against the real Redis: a place per open stream,
freed when it closes or, when its process died, when its lease lapses."""

from __future__ import annotations

import uuid
from typing import Any

from common.eventstreams import StreamLease, streams_open
from tests.support import free_port, wait_until


def test_an_organization_has_at_most_its_quota_open_and_a_release_frees_a_place() -> None:
    organization = uuid.uuid4()
    leases = [StreamLease(organization, ttl_s=60) for _ in range(4)]

    taken = [lease.take(3) for lease in leases]

    assert taken == [True, True, True, False]
    assert streams_open(organization) == 3
    assert streams_open(uuid.uuid4()) == 0  # another organization's are its own
    leases[0].release()
    assert streams_open(organization) == 2
    assert leases[3].take(3)


def test_a_quota_of_zero_opens_none() -> None:
    assert not StreamLease(uuid.uuid4(), ttl_s=60).take(0)


def test_the_lease_of_a_process_that_died_lapses_and_frees_its_place() -> None:
    organization = uuid.uuid4()
    dead = StreamLease(organization, ttl_s=0.5)  # never renewed, never released
    assert dead.take(1)
    waiting = StreamLease(organization, ttl_s=60)
    assert not waiting.take(1)

    wait_until(lambda: waiting.take(1), timeout=10, what="the dead stream's lease to lapse")

    assert streams_open(organization) == 1


def test_a_renewal_counts_a_stream_that_was_not_counted() -> None:
    """A stream opened while Redis was away (or whose lease lapsed) is counted again at
    its next heartbeat: it is open."""
    organization = uuid.uuid4()
    lease = StreamLease(organization, ttl_s=60)

    lease.renew()

    assert streams_open(organization) == 1
    assert not StreamLease(organization, ttl_s=60).take(1)


def test_without_redis_a_stream_opens_uncounted(settings: Any) -> None:
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody there
    lease = StreamLease(uuid.uuid4(), ttl_s=60)

    assert lease.take(1)
    lease.renew()
    lease.release()
    assert streams_open(lease.organization_id) == 0
