"""An artifact's routes on ``Client``: list, upload (whole, or reserved and sent in
parts), download and delete a run's files (docs/artifacts.md)."""

from __future__ import annotations

from typing import IO, Any, cast

from orchestrator_client.http import HttpClient, decoded, segment
from orchestrator_client.pagination import Paginator
from orchestrator_client.types import Artifact, UploadStarted


class Artifacts(HttpClient):
    """An artifact's routes (the module's doc)."""

    # ------------------------------------------------------------------ artifacts
    def artifacts(
        self, run_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[Artifact]:
        path = f"runs/{segment(run_id)}/artifacts"
        return cast(Paginator[Artifact], self._pages(path, {"page_size": page_size}, limit))

    def upload_artifact(
        self,
        run_id: str,
        name: str,
        content: bytes | IO[bytes],
        *,
        content_type: str | None = None,
    ) -> Artifact:
        """Upload a file to the run (multipart, streamed by the server). The API does not
        key this route (a second upload of a name is 409 ``artifact_exists``), so it is
        retried only when it cannot have happened."""
        return self._multipart(f"runs/{segment(run_id)}/artifacts", name, content, content_type, {})

    def upload_job_artifact(
        self,
        job_id: str,
        runner_id: str,
        name: str,
        content: bytes | IO[bytes],
        *,
        content_type: str | None = None,
    ) -> Artifact:
        """Upload a file as an artifact of the step whose job the runner ``runner_id``
        holds (a runner route: 409 ``not_job_owner`` once it no longer holds it);
        retried as ``upload_artifact`` is."""
        path = f"runner/jobs/{segment(job_id)}/artifacts"
        return self._multipart(path, name, content, content_type, {"runner_id": runner_id})

    def _multipart(
        self,
        path: str,
        name: str,
        content: bytes | IO[bytes],
        content_type: str | None,
        fields: dict[str, str],
    ) -> Artifact:
        """POST an artifact's file to ``path``, with ``fields`` beside its name."""
        stream = content if not isinstance(content, bytes) else None
        start = stream.tell() if stream is not None and stream.seekable() else None

        def rewind() -> None:
            if stream is not None and start is not None:
                stream.seek(start)

        media = content_type or "application/octet-stream"
        form = {"name": name, **fields, **({"content_type": content_type} if content_type else {})}
        response = self.request(
            "POST",
            path,
            data=form,
            files={"file": (name, content, media)},
            retry="unkeyed",
            rewind=rewind if start is not None else None,
        )
        return cast(Artifact, decoded(response))

    def start_artifact_upload(
        self,
        run_id: str,
        name: str,
        size: int,
        *,
        content_type: str | None = None,
        sha256: str | None = None,
        idempotency_key: str | None = None,
    ) -> UploadStarted:
        """Reserve a large upload and learn where its bytes go (docs/artifacts.md)."""
        body = {"name": name, "size": size, "content_type": content_type, "sha256": sha256}
        path = f"runs/{segment(run_id)}/artifacts/uploads"
        return cast(UploadStarted, self._post(path, body, idempotency_key=idempotency_key))

    def send_artifact_content(self, artifact_id: str, content: bytes) -> None:
        """The bytes of a started upload, to the API itself (filesystem storage: the
        upload target's ``api_key`` is true)."""
        self.request(
            "PUT",
            f"artifacts/{segment(artifact_id)}/content",
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )

    def complete_artifact_upload(
        self,
        artifact_id: str,
        *,
        parts: list[dict[str, Any]] | None = None,
        sha256: str | None = None,
        idempotency_key: str | None = None,
    ) -> Artifact:
        body = {"parts": parts, "sha256": sha256}
        path = f"artifacts/{segment(artifact_id)}/complete"
        return cast(Artifact, self._post(path, body, idempotency_key=idempotency_key))

    def get_artifact(self, artifact_id: str) -> Artifact:
        return cast(Artifact, self._get(f"artifacts/{segment(artifact_id)}"))

    def delete_artifact(self, artifact_id: str) -> None:
        self.request("DELETE", f"artifacts/{segment(artifact_id)}")

    def download_artifact(self, artifact_id: str) -> bytes:
        """The artifact's bytes (a redirect to storage is followed; httpx does not send
        the API key to another host)."""
        path = f"artifacts/{segment(artifact_id)}/download"
        return self.request("GET", path, follow_redirects=True).content
