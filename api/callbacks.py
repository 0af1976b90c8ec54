"""The callback URL a `callback` step hands out (docs/runners.md, "Callbacks").

``POST /api/v1/callbacks/{token}`` takes no API key: the token is the credential (its
secret is compared in constant time, ``runs.waits.callbacks``), single-use and expiring with
its step. No key means no organization to throttle by; the token's 256 bits make it
unguessable, and an unknown one costs one indexed read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import client_of
from api.base import POST_PARAMETERS, ApiView, validated
from api.errors import WRITE_ERRORS, error_body, error_responses
from api.idempotency import idempotent
from api.serializers import InputSerializer
from common.text import unstorable_string
from runs import selectors
from runs.waits import callbacks

TAG_CALLBACKS = "callbacks"


# How the operation a callback step waits for ended (the schema's CallbackStatusEnum).
CALLBACK_STATUSES = ("completed", "failed")


class CallbackInput(InputSerializer):
    status = serializers.ChoiceField(
        choices=CALLBACK_STATUSES, help_text="How the operation ended."
    )
    result = serializers.JSONField(
        required=False, allow_null=True, help_text="completed: the step's output (any JSON)."
    )
    error = serializers.JSONField(
        required=False, allow_null=True, help_text="failed: why (text, or any JSON)."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for key in ("result", "error"):
            problem = unstorable_string(attrs.get(key))
            if problem:
                raise serializers.ValidationError({key: f"cannot be stored: {problem}"})
        return attrs


class CallbackOutput(serializers.Serializer[Any]):
    ok = serializers.BooleanField()


_CALLBACK_ANSWERS: dict[int | str, Any] = {
    200: CallbackOutput,
    409: OpenApiResponse(
        description="`callback_used`: posted already; `callback_closed`: the step "
        "no longer waits (cancelled, timed out, retried); `organization_suspended`: the "
        "run's organization is suspended (nothing is recorded: post again once it is "
        "lifted)."
    ),
    410: OpenApiResponse(description="`callback_expired`."),
}


def _ended(receive: Callable[[], object]) -> Response:
    try:
        receive()
    except callbacks.CallbackRefused as exc:
        return Response(error_body(exc.code, exc.message), status=exc.status)
    return Response({"ok": True})


class CallbackApi(ApiView):
    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = ()

    @extend_schema(
        operation_id="callbacks_post",
        summary="End a callback step (no API key: the token is the credential)",
        tags=[TAG_CALLBACKS],
        auth=[],
        request=CallbackInput,
        responses={**_CALLBACK_ANSWERS, **error_responses(400, 404)},
    )
    def post(self, request: Request, token: str) -> Response:
        """End the `callback` step that handed out this URL: `completed` with `result` as
        the step's output, or `failed` with `error` (the attempt fails with
        `callback_failed`, and the step's retry policy decides what follows). No API key:
        the URL's token is the credential, and it is good for one post."""
        data = validated(CallbackInput, request.data)
        return _ended(
            lambda: callbacks.receive_callback(
                token, status=data["status"], result=data.get("result"), error=data.get("error")
            )
        )


class RunCallbackApi(ApiView):
    class Input(CallbackInput):
        callback = serializers.UUIDField(
            help_text="The callback's id: `wait` in the payload of the run's event "
            "`waiting for callback ...`."
        )

    @extend_schema(
        operation_id="runs_callback",
        summary="End a callback step of your run by its id (full scope)",
        tags=[TAG_CALLBACKS],
        request=Input,
        parameters=POST_PARAMETERS,
        responses={**_CALLBACK_ANSWERS, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """What a post to the callback's URL does, by your organization: the URL's token
        is shown nowhere it could be read back (a step without a `request` hands it to
        no one), so a key of scope `full` ends the step by the callback's id."""
        client = client_of(request)
        run = selectors.run_get(organization=client.organization, run_id=run_id)
        data = validated(self.Input, request.data)
        return _ended(
            lambda: callbacks.receive_callback_of(
                run=run,
                callback_id=data["callback"],
                actor=client.actor,
                status=data["status"],
                result=data.get("result"),
                error=data.get("error"),
            )
        )
