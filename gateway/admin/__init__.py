"""Operator endpoints beside the S3 API: health and the node's Prometheus metrics."""
