"""The S3 operations, free of HTTP. The S3 front end imports this package and nothing deeper:
the one face it calls (S3Service), and the values that cross it; preload jobs load through
the other face (Loads)."""

from gateway.service.authz import Caller
from gateway.service.buckets import bucket_name_problem
from gateway.service.conditions import ByteRange, Conditions, check_conditions, http_date
from gateway.service.face import Bucket, S3Service
from gateway.service.host_reads import LocalBlocks
from gateway.service.inputs import CopySource, DeleteEntry, Deletion, ListQuery, UploadsQuery
from gateway.service.loads import Block, FillBudget, Loads, Unpinned, listed_info
from gateway.service.multipart import (
    MAX_PART_SIZE,
    PartListing,
    UploadListing,
    check_part_number,
)
from gateway.service.namespace import MountHandle, own_paths, store_options
from gateway.service.reads import Chunk, FileRegion, ObjectResult
from gateway.service.store_errors import cause
from gateway.service.writes import MAX_PUT_SIZE, WriteConditions
from gateway.stores import ListPage, ObjectInfo, PartInfo, WriteAttrs

__all__ = [
    "MAX_PART_SIZE",
    "MAX_PUT_SIZE",
    "Block",
    "Bucket",
    "ByteRange",
    "Caller",
    "Chunk",
    "Conditions",
    "CopySource",
    "DeleteEntry",
    "Deletion",
    "FileRegion",
    "FillBudget",
    "ListPage",
    "ListQuery",
    "Loads",
    "LocalBlocks",
    "MountHandle",
    "ObjectInfo",
    "ObjectResult",
    "PartInfo",
    "PartListing",
    "S3Service",
    "Unpinned",
    "UploadListing",
    "UploadsQuery",
    "WriteAttrs",
    "WriteConditions",
    "bucket_name_problem",
    "cause",
    "check_conditions",
    "check_part_number",
    "http_date",
    "listed_info",
    "own_paths",
    "store_options",
]
