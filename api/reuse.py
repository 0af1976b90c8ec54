"""Work done once, over HTTP (docs/engine.md, "Steps completed without running"): fork a
run from a step, and drop entries of the step cache. Each view validates its input and
calls one function of ``runs.forks`` or ``runs.reuse``."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import transaction
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of
from api.base import POST_PARAMETERS, ApiView, validated
from api.errors import WRITE_ERRORS, error_responses
from api.idempotency import idempotent
from api.parsers import BoundedJSONParser, BoundedYAMLParser
from api.runs import TAG_RUNS, detail_response
from api.schema import PlanField
from api.serializers import (
    InputSerializer,
    RunDetailOutput,
    StrictBooleanField,
    StrictCharField,
    credits_field,
)
from runs import forks, reuse, selectors
from runs.engine.start import run_start
from runs.plan.fields import CACHE_KEY_MAX_LENGTH

# `from` is a keyword in Python: the input's fields are declared by name.
ForkInput = type(
    "ForkInput",
    (InputSerializer,),
    {
        "__doc__": "Where the fork runs again from, and what it changes.",
        "from": StrictCharField(
            max_length=320,
            help_text="The step (`agent.task.step`) from which the fork runs again; what "
            "came before it and completed in the source is reused.",
        ),
        "plan": PlanField(
            required=False,
            help_text="An edited plan (the source's when omitted): the steps it reuses must "
            "be unchanged; steps at or after `from` may change, and be added.",
        ),
        "variables": serializers.DictField(
            required=False, help_text="Laid over the plan's own `variables`."
        ),
        "start": StrictBooleanField(
            default=True, help_text="Start the fork at once (default), or leave it CREATED."
        ),
        "dry_run": StrictBooleanField(
            default=False,
            help_text="Answer what the fork would reuse, run and reserve; create nothing.",
        ),
    },
)


class ForkPreviewOutput(serializers.Serializer[Any]):
    reuse = serializers.ListField(
        child=serializers.CharField(), help_text="The steps it would reuse (`agent.task.step`)."
    )
    run = serializers.ListField(child=serializers.CharField(), help_text="The steps it would run.")
    reservation = credits_field("What its start would reserve.")


class RunForkApi(ApiView):
    # An edited plan may be sent as YAML too, as `POST /runs` takes it (the CLI sends a
    # plan file as it is written).
    parser_classes = (BoundedJSONParser, BoundedYAMLParser)

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="runs_fork",
        summary="Fork an ended run from a step",
        request=ForkInput,
        parameters=POST_PARAMETERS,
        responses={
            201: RunDetailOutput,
            200: OpenApiResponse(
                ForkPreviewOutput, description="`dry_run`: what the fork would do (or a replay)."
            ),
            **error_responses(*WRITE_ERRORS, 404, 402),
        },
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """A new run of the source's plan (or an edited one) whose steps before `from`
        that completed in the source are reused, neither run nor charged; `from` and what
        waits for it run. 400 `invalid_fork`: a `plan` that is not an object, no such
        step, or a step it would reuse changed in the plan (`details.paths`); 409
        `invalid_transition` for a run that has not ended."""
        client = client_of(request)
        # Another organization's run is not found, whatever the body (as for every
        # route of a run): looked up before the body is read.
        selectors.run_get(organization=client.organization, run_id=run_id)
        data = validated(ForkInput, request.data)
        if data["dry_run"]:
            fork = forks.fork_preview(
                run_id=run_id,
                organization=client.organization,
                from_path=data["from"],
                plan=data.get("plan"),
                variables=data.get("variables"),
            )
            preview = {
                "reuse": sorted(fork.reuse),
                "run": fork.run,
                "reservation": fork.reservation,
            }
            return Response(ForkPreviewOutput(preview).data)
        with transaction.atomic():
            run, plan = forks.run_fork(
                run_id=run_id,
                organization=client.organization,
                from_path=data["from"],
                plan=data.get("plan"),
                variables=data.get("variables"),
                actor=client.actor,
            )
            if data["start"]:
                run_start(
                    run_id=run.pk, organization=client.organization, actor=client.actor, plan=plan
                )
        if data["start"]:
            response = detail_response(request, run.pk, status=201)
        else:
            response = Response(RunDetailOutput.row(selectors.created_run_detail(run)), 201)
        response["Location"] = reverse("api:run", kwargs={"run_id": run.pk})
        return response


class CacheInvalidateApi(ApiView):
    class InvalidateInput(InputSerializer):
        """The rendered key whose entries go."""

        key = StrictCharField(max_length=CACHE_KEY_MAX_LENGTH, help_text="A rendered cache key.")

    class InvalidateOutput(serializers.Serializer[Any]):
        invalidated = serializers.IntegerField(help_text="How many entries were dropped.")

    @extend_schema(
        tags=[TAG_RUNS],
        operation_id="cache_invalidate",
        summary="Drop step cache entries",
        request=InvalidateInput,
        parameters=POST_PARAMETERS,
        responses={200: InvalidateOutput, **error_responses(*WRITE_ERRORS)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Drop your organization's step cache entries of `key` (every tool, whatever
        their inputs): the next step with that key runs its tool. None: `invalidated` is
        0."""
        data = validated(self.InvalidateInput, request.data)
        client = client_of(request)
        dropped = reuse.cache_invalidate(organization=client.organization, key=data["key"])
        return Response(self.InvalidateOutput({"invalidated": dropped}).data)
