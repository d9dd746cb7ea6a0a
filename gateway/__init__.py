"""S3-compatible caching gateway."""
