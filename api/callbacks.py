"""The callback URL a `callback` step hands out (docs/runners.md, "Callbacks").

``POST /api/v1/callbacks/{token}`` takes no API key: the token is the credential (its
secret is compared in constant time, ``runs.callbacks``), single-use and expiring with
its step. No key means no organization to throttle by; the token's 256 bits make it
unguessable, and an unknown one costs one indexed read.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from api.errors import error_body, error_responses
from api.serializers import InputSerializer
from api.views import ApiView, validated
from common.text import unstorable_string
from runs import callbacks

TAG_CALLBACKS = "callbacks"


class CallbackInput(InputSerializer):
    status = serializers.ChoiceField(
        choices=["completed", "failed"], help_text="How the operation ended."
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
        responses={
            200: CallbackOutput,
            409: OpenApiResponse(
                description="`callback_used`: posted already; `callback_closed`: the step "
                "no longer waits (cancelled, timed out, retried); `organization_suspended`: "
                "the run's organization is suspended (nothing is recorded: post again once "
                "it is lifted)."
            ),
            410: OpenApiResponse(description="`callback_expired`."),
            **error_responses(400, 404),
        },
    )
    def post(self, request: Request, token: str) -> Response:
        """End the `callback` step that handed out this URL: `completed` with `result` as
        the step's output, or `failed` with `error` (the attempt fails with
        `callback_failed`, and the step's retry policy decides what follows). No API key:
        the URL's token is the credential, and it is good for one post."""
        data = validated(CallbackInput, request.data)
        try:
            callbacks.receive_callback(
                token, status=data["status"], result=data.get("result"), error=data.get("error")
            )
        except callbacks.CallbackRefused as exc:
            return Response(error_body(exc.code, exc.message), status=exc.status)
        return Response({"ok": True})
