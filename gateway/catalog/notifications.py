"""Store change notifications: an S3 origin's event notifications, delivered to an SQS queue,
applied to the catalog within seconds of the change.

Every node of a fleet polls the queue; SQS hands each message to one of them. A message is
deleted once applied, so one whose application failed (the store or the database away) comes
back after its visibility timeout. An event is not trusted for the version it names: the key
is asked of the store (HEAD) and the catalog takes the store's answer, so events that arrive
late or out of order leave the catalog at the truth."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from botocore.config import Config

from gateway.stores import ObjectInfo, ObjectNotFound, Store

log = logging.getLogger(__name__)

WAIT = 5  # seconds a receive waits for a message (SQS long polling)
BACKOFF = 2.0  # seconds before polling again after a failure

# (mount id, key, its version as the store says now or None: gone) changed behind our back
Changed = Callable[[int, str, ObjectInfo | None], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class QueueSource:
    """Where a mount's notifications arrive, and which of them are its keys."""

    queue_url: str
    bucket: str  # the origin's bucket
    root: str  # the mount's prefix in it ('' or ending in '/')
    region: str
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @classmethod
    def of(cls, queue_url: str, uri: str, options: Mapping[str, str]) -> QueueSource:
        """ValueError for a mount that is not an s3:// one."""
        parts = urlsplit(uri)
        if parts.scheme != "s3":
            raise ValueError(f"catalog_queue needs an s3:// mount, not {uri}")
        root = parts.path.strip("/")
        host = urlsplit(queue_url).hostname or ""
        region = options.get("region") or (
            host.split(".")[1] if host.startswith("sqs.") and host.count(".") >= 3 else "us-east-1"
        )
        return cls(
            queue_url, parts.netloc, f"{root}/" if root else "", region,
            options.get("access_key"), options.get("secret_key"), options.get("session_token"),
        )  # fmt: skip


def changed_keys(body: str, bucket: str, root: str) -> list[str]:
    """The mount's keys an S3 event notification names, in order; none for a message that
    names none of them (S3's test event, another bucket, a key outside the mount's prefix).
    Delivered straight from S3 or wrapped by SNS."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and "Records" not in doc and isinstance(doc.get("Message"), str):
            doc = json.loads(doc["Message"])
    except ValueError:
        return []
    records = doc.get("Records") if isinstance(doc, dict) else None
    keys: list[str] = []
    for record in records if isinstance(records, list) else []:
        s3 = record.get("s3") if isinstance(record, dict) else None
        if not isinstance(s3, dict) or (s3.get("bucket") or {}).get("name") != bucket:
            continue
        raw = (s3.get("object") or {}).get("key")
        if isinstance(raw, str):
            key = unquote_plus(raw)  # S3 sends keys form-encoded: '+' for a space
            if key.startswith(root) and key[len(root) :] not in keys:
                keys.append(key[len(root) :])
    return keys


class QueueConsumer:
    """Polls one mount's queue and applies what it says to the catalog."""

    def __init__(self, mount_id: int, store: Store, source: QueueSource, changed: Changed) -> None:
        self.mount_id = mount_id
        self.store = store
        self.source = source
        self.changed = changed

    async def run(self) -> None:
        src = self.source
        parts = urlsplit(src.queue_url)
        from aiobotocore.session import get_session  # 0.6 s to import: only where a queue is

        client: Any = get_session().create_client(
            "sqs",
            region_name=src.region,
            endpoint_url=f"{parts.scheme}://{parts.netloc}",
            aws_access_key_id=src.access_key,
            aws_secret_access_key=src.secret_key,
            aws_session_token=src.session_token,
            config=Config(read_timeout=WAIT + 10, retries={"mode": "standard"}),
        )
        async with client as sqs:
            while True:
                try:
                    got = await sqs.receive_message(
                        QueueUrl=src.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=WAIT
                    )
                    for message in got.get("Messages", []):
                        await self.apply(message["Body"])
                        await sqs.delete_message(
                            QueueUrl=src.queue_url, ReceiptHandle=message["ReceiptHandle"]
                        )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("notifications of %s: %s", src.queue_url, exc)
                    await asyncio.sleep(BACKOFF)

    async def apply(self, body: str) -> int:
        """Bring the catalog to the store's truth for every key the message names; how many."""
        keys = changed_keys(body, self.source.bucket, self.source.root)
        for key in keys:
            try:
                info: ObjectInfo | None = await self.store.stat(key)
            except ObjectNotFound:
                info = None
            await self.changed(self.mount_id, key, info)
        return len(keys)
