"""Cluster metadata: topics, partitions, replicas, leaders, ISR, epochs, configs.

One small interface (``MetadataStore``) with two implementations planned:
``LocalMetadataStore`` (here: a single node, persisted as one JSON document in the data
dir) and a ZooKeeper one for clusters (R-REP-9), which will keep the same objects in znodes.
Every change is persisted before the call returns, so a change the broker acted on is
never lost on a crash (the ISR rule of R-REP-3 relies on that).

File format (``<data>/headrace-metadata.json``): ``{"version": 1, "cluster_id": str,
"next_producer_id": int, "topics": {name: {"topic_id": uuid, "configs": {k: v},
"partitions": [{"replicas": [...], "leader": n, "leader_epoch": n, "isr": [...],
"partition_epoch": n}]}}}``. Written to a temporary file, fsynced and renamed over the old
one (atomic on POSIX); a crash leaves either the old or the new document.

Thread-safety: none; called from the broker's event loop only.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from headrace.fsutil import fsync_dir


@dataclass(slots=True)
class PartitionState:
    replicas: list[int]
    leader: int
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    partition_epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": self.isr,
            "partition_epoch": self.partition_epoch,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartitionState:
        return cls(
            replicas=list(d["replicas"]),
            leader=int(d["leader"]),
            leader_epoch=int(d["leader_epoch"]),
            isr=list(d["isr"]),
            partition_epoch=int(d["partition_epoch"]),
        )


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)  # overrides only, as strings

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": str(self.topic_id),
            "configs": self.configs,
            "partitions": [p.to_json() for p in self.partitions],
        }

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> TopicState:
        return cls(
            name=name,
            topic_id=uuid.UUID(d["topic_id"]),
            partitions=[PartitionState.from_json(p) for p in d["partitions"]],
            configs=dict(d.get("configs", {})),
        )


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


class MetadataStore(Protocol):
    """What the broker needs of cluster metadata, whatever keeps it."""

    @property
    def cluster_id(self) -> str: ...

    def topics(self) -> Mapping[str, TopicState]: ...

    def topic(self, name: str) -> TopicState | None: ...

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None: ...

    def create_topic(
        self, name: str, partitions: list[PartitionState], configs: Mapping[str, str]
    ) -> TopicState: ...

    def delete_topic(self, name: str) -> None: ...

    def add_partitions(self, name: str, partitions: list[PartitionState]) -> None: ...

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None: ...

    def update_partition(self, name: str, index: int, state: PartitionState) -> None: ...

    def allocate_producer_ids(self, count: int) -> int: ...

    def live_brokers(self) -> list[BrokerInfo]: ...

    def controller_id(self) -> int: ...


class MetadataError(Exception):
    """The metadata file is unreadable (a clear message, never a silent reset)."""


def new_cluster_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 chars)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class LocalMetadataStore:
    """Single-node metadata, persisted in the data dir. See the module docstring."""

    FILE_NAME = "headrace-metadata.json"

    def __init__(self, data_dir: Path, self_broker: BrokerInfo, cluster_id: str = "") -> None:
        self._path = data_dir / self.FILE_NAME
        self._self = self_broker
        self._topics: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, TopicState] = {}
        self._next_producer_id = 1000
        self._cluster_id = cluster_id
        if self._path.exists():
            self._load()
        else:
            self._cluster_id = self._cluster_id or new_cluster_id()
            self._save()

    def _load(self) -> None:
        try:
            doc = json.loads(self._path.read_text())
            self._cluster_id = str(doc["cluster_id"])
            self._next_producer_id = int(doc["next_producer_id"])
            for name, t in doc["topics"].items():
                ts = TopicState.from_json(name, t)
                self._topics[name] = ts
                self._by_id[ts.topic_id] = ts
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MetadataError(f"cannot read cluster metadata {self._path}: {e}") from e

    def _save(self) -> None:
        doc = {
            "version": 1,
            "cluster_id": self._cluster_id,
            "next_producer_id": self._next_producer_id,
            "topics": {name: t.to_json() for name, t in self._topics.items()},
        }
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        fsync_dir(self._path.parent)

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def topics(self) -> Mapping[str, TopicState]:
        return self._topics

    def topic(self, name: str) -> TopicState | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        return self._by_id.get(topic_id)

    def create_topic(
        self, name: str, partitions: list[PartitionState], configs: Mapping[str, str]
    ) -> TopicState:
        if name in self._topics:
            raise KeyError(name)
        ts = TopicState(name, uuid.uuid4(), list(partitions), dict(configs))
        self._topics[name] = ts
        self._by_id[ts.topic_id] = ts
        self._save()
        return ts

    def delete_topic(self, name: str) -> None:
        ts = self._topics.pop(name)
        self._by_id.pop(ts.topic_id, None)
        self._save()

    def add_partitions(self, name: str, partitions: list[PartitionState]) -> None:
        self._topics[name].partitions.extend(partitions)
        self._save()

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        self._topics[name].configs = dict(configs)
        self._save()

    def update_partition(self, name: str, index: int, state: PartitionState) -> None:
        self._topics[name].partitions[index] = state
        self._save()

    def allocate_producer_ids(self, count: int) -> int:
        first = self._next_producer_id
        self._next_producer_id += count
        self._save()
        return first

    def live_brokers(self) -> list[BrokerInfo]:
        return [self._self]

    def controller_id(self) -> int:
        return self._self.node_id
