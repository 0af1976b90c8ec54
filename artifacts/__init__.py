"""Files runs produce: their rows, storage on the filesystem or S3 (boto3), uploads and
downloads by presigned URL or through the API, and their expiry with its sweep
(docs/artifacts.md)."""
