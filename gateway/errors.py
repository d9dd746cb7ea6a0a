"""S3 errors, importable from every part (re-exported while the table moves here)."""

from gateway.s3.errors import *  # noqa: F403
from gateway.s3.errors import S3Error  # noqa: F401
