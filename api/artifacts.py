"""Artifacts over HTTP (docs/artifacts.md): upload, list, read, download and delete a
run's files, every route scoped to the key's organization (another's run or artifact is
404), each view a thin caller of ``artifacts.services`` and ``artifacts.selectors``.

Uploads are open to ``runner`` keys too: a runner uploads what its job produced with the
key it polls with, and names the artifact in its result. A runner's upload for a job it
holds (``POST /runner/jobs/{id}/artifacts``, a runner route) is an artifact of the job's
step, as a fleet tool's is: an ``orch worker`` tool's ``Context.upload``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, BinaryIO, ClassVar, cast
from uuid import UUID

from django.conf import settings
from django.http import HttpResponseBase, StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import organization_of
from api.base import ApiView, page_response, validated
from api.errors import LIST_ERRORS, READ_ERRORS, WRITE_ERRORS, error_responses
from api.idempotency import idempotent
from api.pagination import PageQuery, paginated
from api.parsers import PayloadTooLarge
from api.serializers import InputSerializer, StrictCharField
from artifacts import selectors, services
from artifacts.models import Artifact

TAG_ARTIFACTS = "artifacts"
SHA256 = r"^[0-9a-fA-F]{64}$"
# Room for a multipart request's own parts (boundaries, headers, the name) beside its file.
MULTIPART_OVERHEAD = 64 * 1024


# --------------------------------------------------------------------------- shapes
class ArtifactOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes (declared, until an upload completes).")
    sha256 = serializers.CharField(help_text="Lowercase hex; empty until the upload completes.")
    content_type = serializers.CharField()
    status = serializers.ChoiceField(choices=["uploading", "available"])
    run = serializers.UUIDField(source="run_id")
    step = serializers.IntegerField(
        source="step_id", allow_null=True, help_text="The step that saved it, if any."
    )
    created_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="Null while the run has not ended."
    )
    download_url = serializers.SerializerMethodField(
        help_text="Works with your API key (302 to storage, or the bytes)."
    )

    def get_download_url(self, artifact: Artifact) -> str:
        path = reverse("api:artifact-download", args=[artifact.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


ArtifactPage = paginated(ArtifactOutput, "PaginatedArtifactList")


class UploadInput(InputSerializer):
    name = StrictCharField(max_length=255)
    file = serializers.FileField(help_text="The bytes; streamed to storage.")
    # A form sends an empty field for one left blank: taken as not given.
    content_type = StrictCharField(
        max_length=255,
        required=False,
        allow_blank=True,
        help_text="The file part's own type when empty or not given.",
    )


class JobUploadInput(UploadInput):
    runner_id = StrictCharField(max_length=40, help_text="The runner holding the job.")


class StartUploadInput(InputSerializer):
    name = StrictCharField(max_length=255)
    size = serializers.IntegerField(min_value=0, help_text="Bytes the upload will send.")
    content_type = StrictCharField(max_length=255, required=False)
    sha256 = serializers.RegexField(
        SHA256, required=False, help_text="Checked at `complete` when given."
    )


class UploadTargetOutput(serializers.Serializer[Any]):
    method = serializers.CharField(help_text="PUT.")
    url = serializers.CharField(help_text="Empty for a multipart upload (see `parts`).")
    headers = serializers.DictField(child=serializers.CharField())
    api_key = serializers.BooleanField(help_text="Send your API key (`Authorization`) too.")
    parts = serializers.ListField(
        child=serializers.DictField(), help_text="`{part_number, url}`, each `part_size` bytes."
    )
    part_size = serializers.IntegerField()


class StartUploadOutput(serializers.Serializer[Any]):
    artifact = ArtifactOutput()
    upload = UploadTargetOutput()


class PartInput(InputSerializer):
    part_number = serializers.IntegerField(min_value=1, max_value=10_000)
    etag = StrictCharField(max_length=1024)


class CompleteInput(InputSerializer):
    parts = PartInput(many=True, required=False)
    sha256 = serializers.RegexField(SHA256, required=False)


def _output(request: Request, artifact: Artifact) -> dict[str, Any]:
    return dict(ArtifactOutput(artifact, context={"request": request}).data)


def _fresh(request: Request, artifact: Artifact) -> dict[str, Any]:
    """As the API shows it, with ``expires_at``."""
    found = selectors.artifact_get(organization=organization_of(request), artifact_id=artifact.pk)
    return _output(request, found)


def _refuse_oversized(request: Request) -> None:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return
    limit = settings.ARTIFACT_MAX_FILE_BYTES + MULTIPART_OVERHEAD
    if length > limit:
        raise PayloadTooLarge(f"request body is {length} bytes; at most {limit} allowed")


# --------------------------------------------------------------------------- views
class RunArtifactsApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}
    parser_classes = (MultiPartParser,)
    large_body = True
    uploads_allowed_to_runners = True

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="List a run's artifacts",
        operation_id="artifacts_list",
        parameters=[PageQuery],
        responses={200: ArtifactPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, run_id: UUID) -> Response:
        """Uploading and available artifacts, oldest first."""
        rows = selectors.artifact_list(organization=organization_of(request), run_id=run_id)
        return page_response(
            request, rows, self.query, partial(ArtifactOutput, context={"request": request})
        )

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Upload an artifact (multipart)",
        operation_id="artifacts_upload",
        request={"multipart/form-data": UploadInput},
        responses={
            201: ArtifactOutput,
            503: OpenApiResponse(description="`storage_unavailable`: nothing was recorded."),
            **error_responses(*WRITE_ERRORS, 404),
        },
    )
    def post(self, request: Request, run_id: UUID) -> Response:
        """Streamed to storage (a file beyond 2.5 MB is spooled to disk, never held in
        memory). Not `Idempotency-Key`-aware: the name is, a second upload under it is
        409 `artifact_exists`."""
        _refuse_oversized(request)
        # Another organization's run is 404 whatever the body says.
        selectors.run_of(organization=organization_of(request), run_id=run_id)
        data = validated(UploadInput, request.data)
        upload = data["file"]
        artifact = services.upload(
            organization=organization_of(request),
            run_id=run_id,
            name=data["name"],
            stream=upload,
            size=upload.size or 0,
            content_type=data.get("content_type") or upload.content_type or "",
        )
        return Response(_fresh(request, artifact), status=201)


class JobArtifactsApi(ApiView):
    parser_classes = (MultiPartParser,)
    large_body = True
    runner_route = True

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Upload an artifact of a job's step (multipart, runners)",
        operation_id="runner_job_artifacts_upload",
        request={"multipart/form-data": JobUploadInput},
        responses={
            201: ArtifactOutput,
            503: OpenApiResponse(description="`storage_unavailable`: nothing was recorded."),
            **error_responses(*WRITE_ERRORS, 404),
        },
    )
    def post(self, request: Request, job_id: UUID) -> Response:
        """As `POST /runs/{id}/artifacts`, in the job's run, the artifact naming the job's
        step (`step`), as a fleet tool's does. 409 `not_job_owner` from a runner that does
        not hold the job (claimed, running or stopping) now; nothing is stored then."""
        _refuse_oversized(request)
        data = validated(JobUploadInput, request.data)
        upload = data["file"]
        artifact = services.job_upload(
            organization=organization_of(request),
            runner_id=data["runner_id"],
            job_id=job_id,
            name=data["name"],
            stream=upload,
            size=upload.size or 0,
            content_type=data.get("content_type") or upload.content_type or "",
        )
        return Response(_fresh(request, artifact), status=201)


class RunArtifactUploadsApi(ApiView):
    uploads_allowed_to_runners = True

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Start a large upload (presigned)",
        operation_id="artifacts_start_upload",
        request=StartUploadInput,
        responses={201: StartUploadOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request, run_id: UUID) -> Response:
        """Reserve the artifact (`uploading`) and say where its bytes go: a presigned PUT
        (or part URLs above the multipart threshold) on S3; the API's own
        `PUT /artifacts/{id}/content` on the filesystem. Then `POST .../complete`."""
        selectors.run_of(organization=organization_of(request), run_id=run_id)
        data = validated(StartUploadInput, request.data)
        started = services.start_upload(
            organization=organization_of(request),
            run_id=run_id,
            name=data["name"],
            size=data["size"],
            content_type=data.get("content_type", ""),
            sha256=data.get("sha256", ""),
        )
        target = started.target
        artifact = started.artifact
        if target is None:
            path = reverse("api:artifact-content", args=[artifact.pk])
            upload = {
                "method": "PUT",
                "url": request.build_absolute_uri(path),
                "headers": {"Content-Type": artifact.content_type},
                "api_key": True,
                "parts": [],
                "part_size": 0,
            }
        else:
            upload = {
                "method": "PUT",
                "url": target.url,
                "headers": target.headers,
                "api_key": False,
                "parts": target.parts,
                "part_size": target.part_size,
            }
        return Response({"artifact": _fresh(request, artifact), "upload": upload}, status=201)


class ArtifactApi(ApiView):
    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Show an artifact",
        operation_id="artifacts_retrieve",
        responses={200: ArtifactOutput, **error_responses(*READ_ERRORS, 404)},
    )
    def get(self, request: Request, artifact_id: UUID) -> Response:
        """One artifact: its name, size, SHA-256, content type and status, the run and
        step it belongs to, when it expires, and its `download_url`."""
        artifact = selectors.artifact_get(
            organization=organization_of(request), artifact_id=artifact_id
        )
        return Response(_output(request, artifact))

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Delete an artifact",
        operation_id="artifacts_delete",
        responses={204: None, **error_responses(*WRITE_ERRORS, 404)},
    )
    def delete(self, request: Request, artifact_id: UUID) -> Response:
        """Gone at once for clients; its object is deleted now, or by the sweep when
        storage cannot be reached."""
        services.delete(organization=organization_of(request), artifact_id=artifact_id)
        return Response(status=204)


class ArtifactCompleteApi(ApiView):
    uploads_allowed_to_runners = True

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Complete a presigned upload",
        operation_id="artifacts_complete",
        request=CompleteInput,
        responses={200: ArtifactOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request, artifact_id: UUID) -> Response:
        """Storage must hold the declared size (and the SHA-256, when given here or at
        the start): otherwise 409 `upload_mismatch` and the upload stays open."""
        selectors.artifact_get(organization=organization_of(request), artifact_id=artifact_id)
        data = validated(CompleteInput, request.data)
        artifact = services.complete_upload(
            organization=organization_of(request),
            artifact_id=artifact_id,
            parts=[dict(part) for part in data.get("parts", [])],
            sha256=data.get("sha256", ""),
        )
        return Response(_fresh(request, artifact))


class ArtifactContentApi(ApiView):
    large_body = True
    uploads_allowed_to_runners = True

    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Send a presigned upload's bytes (filesystem storage)",
        operation_id="artifacts_content",
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={204: None, **error_responses(*WRITE_ERRORS, 404)},
    )
    def put(self, request: Request, artifact_id: UUID) -> Response:
        """The raw body is the file, streamed to storage; then `complete`."""
        _refuse_oversized(request)
        services.receive_content(
            organization=organization_of(request),
            artifact_id=artifact_id,
            # The body, read as a stream (Django's request is file-like), never parsed.
            stream=cast(BinaryIO, request._request),
        )
        return Response(status=204)


class ArtifactDownloadApi(ApiView):
    @extend_schema(
        tags=[TAG_ARTIFACTS],
        summary="Download an artifact",
        operation_id="artifacts_download",
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            302: OpenApiResponse(description="To a presigned URL of at most 15 minutes (S3)."),
            **error_responses(*READ_ERRORS, 404, 409),
        },
    )
    def get(self, request: Request, artifact_id: UUID) -> HttpResponseBase:
        """Keeps the artifact at least an hour more. 409 `artifact_not_ready` while its
        upload has not completed."""
        found = services.download(organization=organization_of(request), artifact_id=artifact_id)
        if found.url is not None:
            return Response(status=302, headers={"Location": found.url})
        artifact = found.artifact
        assert found.chunks is not None  # no URL: the backend streams
        response = StreamingHttpResponse(found.chunks, content_type=artifact.content_type)
        response["Content-Length"] = str(artifact.size)
        response["Content-Disposition"] = f'attachment; filename="{_ascii(artifact.name)}"'
        return response


def _ascii(name: str) -> str:
    return name.encode("ascii", "replace").decode().replace('"', "'")
