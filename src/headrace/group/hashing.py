"""PURE: which ``__consumer_offsets`` partition (and so which coordinator) owns a group.

Kafka maps a group to ``abs(groupId.hashCode()) % offsets.topic.num.partitions``
(``Utils.abs`` of Java's ``String.hashCode``, R-GRP-2), so the same group lands on the
same partition number here as on Kafka.
"""

from __future__ import annotations


def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode``: s[0]*31^(n-1) + ... over UTF-16 code units, as int32."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: ``n & 0x7fffffff`` (so Integer.MIN_VALUE maps to 0)."""
    return n & 0x7FFFFFFF


def offsets_partition_for(group_id: str, num_partitions: int) -> int:
    return kafka_abs(java_string_hashcode(group_id)) % num_partitions
