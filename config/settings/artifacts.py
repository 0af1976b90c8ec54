"""Where run artifacts are stored and their bounds (docs/configuration.md, "Artifacts";
docs/artifacts.md)."""

from __future__ import annotations

from config.settings.environment import BASE_DIR, env

# --------------------------------------------------------------------------- artifacts
# Files runs produce (docs/artifacts.md): on the local filesystem by default, or in any
# S3-compatible store through boto3 (credentials from the usual AWS variables).
ARTIFACTS_BACKEND = env.choice(
    "ARTIFACTS_BACKEND", "filesystem", ("filesystem", "s3"), "where artifacts are stored"
)
ARTIFACTS_ROOT = env.string(
    "ARTIFACTS_ROOT", str(BASE_DIR / ".data" / "artifacts"), "the filesystem backend's directory"
)
ARTIFACTS_S3_BUCKET = env.string("ARTIFACTS_S3_BUCKET", "", "the S3 backend's bucket")
ARTIFACTS_S3_ENDPOINT_URL = env.string(
    "ARTIFACTS_S3_ENDPOINT_URL", "", "an S3-compatible endpoint (empty: AWS)"
)
ARTIFACTS_S3_REGION = env.string("ARTIFACTS_S3_REGION", "us-east-1", "the S3 backend's region")
ARTIFACT_RETENTION_DAYS = env.integer(
    "ARTIFACT_RETENTION_DAYS", 30, "days artifacts are kept after their run ended", minimum=1
)
ARTIFACT_MAX_FILE_BYTES = env.integer(
    "ARTIFACT_MAX_FILE_BYTES", 10 * 1024**3, "largest artifact, bytes", minimum=1
)
ARTIFACT_RUN_MAX_BYTES = env.integer(
    "ARTIFACT_RUN_MAX_BYTES", 10 * 1024**3, "most artifact bytes one run may hold", minimum=1
)
ARTIFACT_MAX_IN_FLIGHT = env.integer(
    "ARTIFACT_MAX_IN_FLIGHT", 10, "uploads one run may have in flight at once", minimum=1
)
# A presigned upload's URLs last this long; an upload not completed by then is
# abandoned, and the sweep removes it.
ARTIFACT_UPLOAD_SECONDS = env.integer(
    "ARTIFACT_UPLOAD_SECONDS", 3600, "seconds a presigned upload stays open", minimum=60
)
ARTIFACT_DOWNLOAD_URL_SECONDS = env.integer(
    "ARTIFACT_DOWNLOAD_URL_SECONDS", 900, "seconds a download URL lasts", minimum=1, maximum=900
)
# S3 takes at most 5 GB in one PUT: larger presigned uploads are multipart, in parts of
# ARTIFACT_MULTIPART_PART_SIZE (S3's minimum is 5 MiB).
ARTIFACT_MULTIPART_THRESHOLD = env.integer(
    "ARTIFACT_MULTIPART_THRESHOLD", 5 * 1000**3, "bytes above which uploads are multipart"
)
ARTIFACT_MULTIPART_PART_SIZE = env.integer(
    "ARTIFACT_MULTIPART_PART_SIZE", 512 * 1024**2, "bytes per multipart part", minimum=5 * 1024**2
)
ARTIFACT_SWEEP_BATCH = 500
