"""The hdfs:// store: a folder of an HDFS, over WebHDFS, seen as a bucket."""

from gateway.stores.hdfs.store import CHUNK_SIZE, HdfsStore, open_hdfs

__all__ = ["CHUNK_SIZE", "HdfsStore", "open_hdfs"]
