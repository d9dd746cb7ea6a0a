"""The S3 action names a policy may name (AWS's list, as of 2024, less the ones for features
no S3-compatible store has: Outposts, access points, Storage Lens, ...). A policy that names
an action outside it, or a wildcard that matches none of it, is malformed, as S3 says."""

from __future__ import annotations

_NAMES = """
AbortMultipartUpload BypassGovernanceRetention CreateBucket DeleteBucket DeleteBucketPolicy
DeleteBucketWebsite DeleteBucketOwnershipControls DeleteObject DeleteObjectTagging
DeleteObjectVersion DeleteObjectVersionTagging GetAccelerateConfiguration
GetAnalyticsConfiguration GetBucketAcl GetBucketCORS GetBucketLocation GetBucketLogging
GetBucketNotification GetBucketObjectLockConfiguration GetBucketOwnershipControls
GetBucketPolicy GetBucketPolicyStatus GetBucketPublicAccessBlock GetBucketRequestPayment
GetBucketTagging GetBucketVersioning GetBucketWebsite GetEncryptionConfiguration
GetInventoryConfiguration GetLifecycleConfiguration GetMetricsConfiguration GetObject
GetObjectAcl GetObjectAttributes GetObjectLegalHold GetObjectRetention GetObjectTagging
GetObjectTorrent GetObjectVersion GetObjectVersionAcl GetObjectVersionAttributes
GetObjectVersionTagging GetReplicationConfiguration ListAllMyBuckets ListBucket
ListBucketMultipartUploads ListBucketVersions ListMultipartUploadParts PutAccelerateConfiguration
PutAnalyticsConfiguration PutBucketAcl PutBucketCORS PutBucketLogging PutBucketNotification
PutBucketObjectLockConfiguration PutBucketOwnershipControls PutBucketPolicy
PutBucketPublicAccessBlock PutBucketRequestPayment PutBucketTagging PutBucketVersioning
PutBucketWebsite PutEncryptionConfiguration PutInventoryConfiguration
PutLifecycleConfiguration PutMetricsConfiguration PutObject PutObjectAcl PutObjectLegalHold
PutObjectRetention PutObjectTagging PutObjectVersionAcl PutObjectVersionTagging
PutReplicationConfiguration ReplicateDelete ReplicateObject ReplicateTags RestoreObject
"""

ACTIONS: tuple[str, ...] = tuple(sorted(f"s3:{name}" for name in _NAMES.split()))
BY_LOWER: dict[str, str] = {a.lower(): a for a in ACTIONS}
