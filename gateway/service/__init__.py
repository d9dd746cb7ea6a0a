"""The S3 operations themselves, free of HTTP: get, head, list, and (later) writes."""
