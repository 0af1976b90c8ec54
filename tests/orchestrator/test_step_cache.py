"""The step cache on the worker's side (orchestrator/asks.py, runs/reuse.py): an entry
answers only a step of the same rendered params unless the cache says `inputs: false`,
and there is one entry per organization, tool, key and inputs, the newest. Each step is
executed in this process, as a worker would (``executor.execute_step``)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from billing.models import Organization
from billing.secrets import secret_put
from common.digests import canonical_json
from orchestrator import executor
from runs import reuse, services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Step, StepCacheEntry
from tests import factories

pytestmark = pytest.mark.django_db


def cached_echo(q: str, **cache: Any) -> dict[str, Any]:
    """One `echo` step of ``q`` whose cache key leaves ``q`` out."""
    spec = factories.plan(steps=1, variables={"q": q})
    spec["agents"][0]["tasks"][0]["steps"][0].update(
        tool="echo",
        params={"q": "${variables.q}", "token": "${secrets.TOKEN}"},
        cache={"key": "price", "ttl": "1h", **cache},
    )
    return spec


def executed(organization: Organization, spec: dict[str, Any]) -> Step:
    """The step of a one-step run of ``spec``, once executed."""
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)
    control.pick_up(run.pk)
    step = Step.objects.get(run=run)
    assert executor.execute_step(step.pk, worker="worker:test") == "completed"
    return Step.objects.get(pk=step.pk)


@pytest.fixture
def organization() -> Organization:
    organization = factories.org()
    secret_put(organization=organization, name="TOKEN", value="tok-1")
    return organization


def test_a_cache_hit_takes_only_an_entry_of_the_same_rendered_params(
    organization: Organization,
) -> None:
    chips = executed(organization, cached_echo("chips"))
    salt = executed(organization, cached_echo("salt"))  # the same key, another input
    again = executed(organization, cached_echo("chips"))

    assert (salt.cached_from, salt.output["q"]) == (None, "salt")
    assert again.cached_from == {"run": str(chips.run_id), "step": chips.pk}
    assert again.output == chips.output


def test_a_cache_without_inputs_answers_every_step_of_its_key(
    organization: Organization,
) -> None:
    chips = executed(organization, cached_echo("chips", inputs=False))
    salt = executed(organization, cached_echo("salt", inputs=False))

    assert salt.cached_from == {"run": str(chips.run_id), "step": chips.pk}
    assert salt.output["q"] == "chips"  # what the key alone said, as declared


def test_a_secret_the_params_read_is_an_input_and_its_digest_is_keyed(
    organization: Organization, settings: Any
) -> None:
    first = executed(organization, cached_echo("chips"))
    secret_put(organization=organization, name="TOKEN", value="tok-2")
    rotated = executed(organization, cached_echo("chips"))

    assert rotated.cached_from is None
    rendered = {"q": "chips", "token": "tok-1"}
    entry = StepCacheEntry.objects.get(step=first)
    assert entry.inputs == reuse.cache_inputs(rendered)
    # A guess of the secret cannot be confirmed from the row without the server's key.
    assert entry.inputs != hashlib.sha256(canonical_json(rendered)).hexdigest()
    settings.SECRET_KEY = "another-server-" + "k" * 40
    assert reuse.cache_inputs(rendered) != entry.inputs


def test_a_newer_entry_of_a_key_and_inputs_replaces_the_older(
    organization: Organization,
) -> None:
    first = executed(organization, cached_echo("chips"))
    StepCacheEntry.objects.update(created_at=timezone.now() - timedelta(hours=2))  # past ttl
    first_id = StepCacheEntry.objects.get().pk
    second = executed(organization, cached_echo("chips"))  # a miss: it runs, and is kept

    assert second.cached_from is None
    entry = StepCacheEntry.objects.get()
    assert (entry.run_id, entry.step_id) == (second.run_id, second.pk)
    # A new id too: the retention sweep walks entries by id, oldest first.
    assert entry.pk > first_id
    assert timezone.now() - entry.created_at < timedelta(minutes=1)
    assert executed(organization, cached_echo("chips")).cached_from == {
        "run": str(second.run_id),
        "step": second.pk,
    }
    assert first.pk != second.pk


def test_invalidating_a_key_drops_its_entries_whatever_their_inputs(
    organization: Organization,
) -> None:
    executed(organization, cached_echo("chips"))
    executed(organization, cached_echo("salt"))
    executed(organization, cached_echo("chips", inputs=False))
    other = factories.org()
    secret_put(organization=other, name="TOKEN", value="tok-1")
    executed(other, cached_echo("chips"))

    assert reuse.cache_invalidate(organization=organization, key="price") == 3
    assert StepCacheEntry.objects.filter(organization=organization).count() == 0
    assert StepCacheEntry.objects.filter(organization=other).count() == 1
    assert executed(organization, cached_echo("chips")).cached_from is None
