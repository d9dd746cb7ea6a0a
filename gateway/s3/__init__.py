"""The S3 wire protocol: routing, SigV4, XML in and out, S3 error codes."""
