"""Where artifacts' bytes live: the local filesystem (the default: `make run` needs
nothing else) or any S3-compatible endpoint through boto3 (``ARTIFACTS_BACKEND=s3``).

A thin layer over boto3 rather than django-storages' S3 storage: what artifacts need
beyond save and delete is a presigned PUT, presigned multipart part URLs, completing and
aborting a multipart upload and a HEAD for the size, none of which a Django ``Storage``
offers; through it, each would be a reach into ``storage.connection.meta.client`` around
a class adding nothing but its settings names. Both backends stream: a file is read and
written in chunks, hashed (SHA-256) on the way, never held whole in memory.

Every storage failure (refused, unreachable, timed out) is ``StorageUnavailable``: the
API answers 503 ``storage_unavailable`` and the services leave nothing half-recorded.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

CHUNK = 1024 * 1024


class StorageUnavailable(Exception):
    code = "storage_unavailable"
    retry_after = 5


@dataclass(frozen=True)
class Stored:
    size: int
    sha256: str


@dataclass(frozen=True)
class UploadTarget:
    """How a client sends a presigned upload's bytes: one PUT to ``url`` with
    ``headers``, or one PUT per part (``parts``: number and URL) of ``part_size`` bytes
    (the last one shorter), then ``complete`` with each part's ETag."""

    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[dict[str, Any]] = field(default_factory=list)
    part_size: int = 0
    upload_id: str = ""


class Backend(Protocol):
    name: str

    def save(self, key: str, stream: BinaryIO, content_type: str) -> Stored: ...

    def chunks(self, key: str) -> Iterator[bytes]: ...

    def size(self, key: str) -> int | None: ...

    def delete(self, key: str) -> None: ...

    def download_url(self, key: str, filename: str, content_type: str) -> str | None: ...

    def upload_target(self, key: str, size: int, content_type: str) -> UploadTarget | None: ...

    def complete_multipart(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None: ...

    def abort_multipart(self, key: str, upload_id: str) -> None: ...


def hashed_chunks(stream: BinaryIO) -> Iterator[bytes]:
    """``stream`` in chunks; the caller hashes them as they pass."""
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            return
        yield chunk


class _HashingReader:
    """A file-like reader that hashes and counts what it hands out (boto3 reads the
    stream once, in order: uploads are made without threads)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.digest.update(chunk)
        self.size += len(chunk)
        return chunk


# --------------------------------------------------------------------------- filesystem
class FileSystemBackend:
    """Files under ``ARTIFACTS_ROOT``, each written to a temporary name and renamed into
    place, so that a reader never sees half a file. Downloads are streamed by the API;
    presigned uploads go through the API too (``PUT /api/v1/artifacts/{id}/content``)."""

    name = "filesystem"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"key {key!r} leaves the artifacts root")
        return path

    def save(self, key: str, stream: BinaryIO, content_type: str) -> Stored:
        path = self._path(key)
        digest = hashlib.sha256()
        size = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
                try:
                    for chunk in hashed_chunks(stream):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                except BaseException:
                    os.unlink(out.name)
                    raise
            os.replace(out.name, path)
        except OSError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc
        return Stored(size, digest.hexdigest())

    def chunks(self, key: str) -> Iterator[bytes]:
        try:
            with self._path(key).open("rb") as stream:
                yield from hashed_chunks(stream)
        except OSError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc

    def download_url(self, key: str, filename: str, content_type: str) -> str | None:
        return None  # the API streams it

    def upload_target(self, key: str, size: int, content_type: str) -> UploadTarget | None:
        return None  # the API takes it (PUT .../content)

    def complete_multipart(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        raise ValueError("the filesystem backend has no multipart uploads")

    def abort_multipart(self, key: str, upload_id: str) -> None:
        return None


# --------------------------------------------------------------------------- S3
class S3Backend:
    """Objects in ``ARTIFACTS_S3_BUCKET`` at ``ARTIFACTS_S3_ENDPOINT_URL`` (AWS when
    empty), credentials from the usual AWS variables. Downloads are presigned GETs of at
    most 15 minutes; uploads above ``ARTIFACT_MULTIPART_THRESHOLD`` are multipart."""

    name = "s3"

    def __init__(self, bucket: str, endpoint_url: str, region: str) -> None:
        self.bucket = bucket
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region,
            config=Config(
                signature_version="s3v4",
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )

    def _call(self, operation: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, operation)(**kwargs)
        except ClientError as exc:
            raise StorageUnavailable(f"artifact storage refused {operation}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc

    def save(self, key: str, stream: BinaryIO, content_type: str) -> Stored:
        reader = _HashingReader(stream)
        self._call(
            "upload_fileobj",
            Fileobj=reader,
            Bucket=self.bucket,
            Key=key,
            ExtraArgs={"ContentType": content_type},
            # One thread reads the stream in order: the hash sees every byte once.
            Config=TransferConfig(use_threads=False),
        )
        return Stored(reader.size, reader.digest.hexdigest())

    def chunks(self, key: str) -> Iterator[bytes]:
        body = self._call("get_object", Bucket=self.bucket, Key=key)["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def size(self, key: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StorageUnavailable(f"artifact storage refused head_object: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc

    def delete(self, key: str) -> None:
        self._call("delete_object", Bucket=self.bucket, Key=key)

    def download_url(self, key: str, filename: str, content_type: str) -> str | None:
        seconds = min(int(settings.ARTIFACT_DOWNLOAD_URL_SECONDS), 900)
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentType": content_type,
            "ResponseContentDisposition": _attachment(filename),
        }
        return str(
            self._call(
                "generate_presigned_url",
                ClientMethod="get_object",
                Params=params,
                ExpiresIn=seconds,
            )
        )

    def upload_target(self, key: str, size: int, content_type: str) -> UploadTarget | None:
        seconds = int(settings.ARTIFACT_UPLOAD_SECONDS)
        if size <= int(settings.ARTIFACT_MULTIPART_THRESHOLD):
            url = self._call(
                "generate_presigned_url",
                ClientMethod="put_object",
                Params={"Bucket": self.bucket, "Key": key, "ContentType": content_type},
                ExpiresIn=seconds,
            )
            return UploadTarget(url=str(url), headers={"Content-Type": content_type})
        part_size = int(settings.ARTIFACT_MULTIPART_PART_SIZE)
        started = self._call(
            "create_multipart_upload", Bucket=self.bucket, Key=key, ContentType=content_type
        )
        upload_id = str(started["UploadId"])
        parts = [
            {
                "part_number": number,
                "url": str(
                    self._call(
                        "generate_presigned_url",
                        ClientMethod="upload_part",
                        Params={
                            "Bucket": self.bucket,
                            "Key": key,
                            "UploadId": upload_id,
                            "PartNumber": number,
                        },
                        ExpiresIn=seconds,
                    )
                ),
            }
            for number in range(1, math.ceil(size / part_size) + 1)
        ]
        return UploadTarget(parts=parts, part_size=part_size, upload_id=upload_id)

    def complete_multipart(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        self._call(
            "complete_multipart_upload",
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": p["part_number"], "ETag": p["etag"]} for p in parts]
            },
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise StorageUnavailable(f"artifact storage refused abort: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(f"artifact storage failed: {exc}") from exc


def _attachment(filename: str) -> str:
    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "'")
    return f'attachment; filename="{ascii_name}"'


@functools.cache
def _backend(kind: str, root: str, bucket: str, endpoint: str, region: str) -> Backend:
    if kind == "s3":
        return S3Backend(bucket, endpoint, region)
    return FileSystemBackend(root)


def backend() -> Backend:
    """The configured backend (one per configuration per process: boto3 clients are
    thread-safe and costly to make)."""
    return _backend(
        settings.ARTIFACTS_BACKEND,
        str(settings.ARTIFACTS_ROOT),
        settings.ARTIFACTS_S3_BUCKET,
        settings.ARTIFACTS_S3_ENDPOINT_URL,
        settings.ARTIFACTS_S3_REGION,
    )
