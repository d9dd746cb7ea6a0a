"""Operator endpoints beside the S3 API: health (and, later, metrics and the dashboard)."""
