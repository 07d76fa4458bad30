"""Cluster metadata: topics, partitions, replicas, leaders, ISR, epochs, configs.

One small interface (``MetadataStore``) with two implementations planned:
``LocalMetadataStore`` (here: a single node, an embedded SQLite database in the data dir)
and a ZooKeeper one for clusters (R-REP-9), which will keep the same objects in znodes.
Every change is persisted before the call returns, so a change the broker acted on is
never lost on a crash (the ISR rule of R-REP-3 relies on that).

Storage (``<data>/headrace-metadata.db``): SQLite in WAL mode with ``synchronous=FULL``,
so a committed change survives power loss. Every change is ONE transaction touching only
the rows it changes (creating a 10,000-partition topic is one ``executemany``, not a
rewrite of everything): ``meta(key, value)`` holds ``cluster_id`` and
``next_producer_id``; ``topics(name, topic_id, configs)`` (configs as a JSON object of
overrides); ``partitions(topic, idx, replicas, leader, leader_epoch, isr,
partition_epoch)``. Reads are served from memory; a write goes to SQLite first and only
then to memory, so a write that fails (disk full, I/O error: ``MetadataWriteError``)
leaves both the database and memory exactly as they were.

ACLs and SCRAM credentials (issue 12): ``acls(resource_type, pattern_type, name, acls)``
(one row per resource pattern, its entries as the JSON Kafka keeps in ZooKeeper) and
``scram_credentials(user, mechanism, credential)`` (Kafka's stored text: salt, stored and
server keys, iterations; never a password); ``client_quotas(entity, quotas)`` (Kafka's
entity path, ``users/alice/clients/app``, and a JSON object of the entity's quotas).

Dynamic broker configs and group configs (issue 27): ``entity_configs(entity, configs)``,
one row per entity by Kafka's ZooKeeper entity path (``brokers/<default>``, ``brokers/0``,
``groups/<group>``) and its configs as a JSON object of strings.

Migration: a data dir of an older headrace holds ``headrace-metadata.json`` (one JSON
document, ``{"version": 1, "cluster_id", "next_producer_id", "topics": {name:
{"topic_id", "configs", "partitions": [...]}}}``). On the first start it is imported in
the same transaction that creates the schema, then renamed to
``headrace-metadata.json.migrated`` (kept as a backup; a crash between the two leaves the
JSON, which is renamed at the next start since the database already holds the cluster).

Thread-safety: none; called from the broker's event loop only.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from headrace.fsutil import fsync_dir
from headrace.security import acl
from headrace.security.quotas import QuotaEntity, QuotaError, QuotaTable, stored_quotas
from headrace.security.scram import ScramCredential, format_credential, parse_credential

AclEntries = frozenset[acl.AccessControlEntry]
UserCredentials = dict[str, ScramCredential]
"""A user's SCRAM credentials by mechanism name ("SCRAM-SHA-256", "SCRAM-SHA-512")."""


@dataclass(slots=True)
class PartitionState:
    replicas: list[int]
    leader: int
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    partition_epoch: int = 0
    # a cluster's: the controller epoch of the last write of the state znode and that
    # znode's version (conditional updates); -1 on a single node (not persisted there)
    controller_epoch: int = -1
    zk_version: int = -1

    def copy(self) -> PartitionState:
        """A copy with lists of its own, built directly: ``dataclasses.replace`` costs
        several times as much, and a failover copies tens of thousands (the controller's
        decisions and writes, each broker's transitions: bench/cluster_bench.py --scale)."""
        return PartitionState(list(self.replicas), self.leader, self.leader_epoch,
                              list(self.isr), self.partition_epoch, self.controller_epoch,
                              self.zk_version)

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
            replicas=[int(r) for r in d["replicas"]],
            leader=int(d["leader"]),
            leader_epoch=int(d["leader_epoch"]),
            isr=[int(r) for r in d["isr"]],
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
            configs={str(k): str(v) for k, v in dict(d.get("configs", {})).items()},
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    listener: str
    protocol: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker as others reach it: ``host``/``port`` on the inter-broker listener, and
    every listener's advertised endpoint (Metadata answers a client with the endpoints of
    the listener it connected to)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    endpoints: tuple[Endpoint, ...] = ()

    def on_listener(self, listener: str) -> BrokerInfo | None:
        """This broker as seen from ``listener`` (its host and port there); itself if it
        names no endpoints (one listener); None if it has no such listener."""
        if not self.endpoints:
            return self
        for e in self.endpoints:
            if e.listener == listener:
                return BrokerInfo(self.node_id, e.host, e.port, self.rack, self.endpoints)
        return None


class MetadataStore(Protocol):
    """What the broker needs of cluster metadata, whatever keeps it."""

    @property
    def cluster_id(self) -> str: ...

    def topics(self) -> Mapping[str, TopicState]: ...

    def topic(self, name: str) -> TopicState | None: ...

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None: ...

    def create_topic(
        self, name: str, partitions: list[PartitionState], configs: Mapping[str, str],
        topic_id: uuid.UUID | None = None,
    ) -> TopicState:
        """``topic_id`` None: a new random id."""
        ...

    def delete_topic(self, name: str) -> None: ...

    def add_partitions(self, name: str, partitions: list[PartitionState]) -> None: ...

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None: ...

    def update_partition(self, name: str, index: int, state: PartitionState) -> None: ...

    def allocate_producer_ids(self, count: int) -> int: ...

    def live_brokers(self) -> list[BrokerInfo]: ...

    def controller_id(self) -> int: ...

    # ACLs and SCRAM credentials (issue 12). Reads are from memory, kept current on every
    # broker; writes are blocking (a cluster's are ZooKeeper round trips: worker threads)
    # and return what the caller installs with ``install_acls`` / ``install_credentials``
    # on the event loop, so a client sees its own change at once.
    @property
    def acl_index(self) -> acl.AclIndex: ...

    def change_acls(self, pattern: acl.ResourcePattern, add: AclEntries,
                    remove: AclEntries) -> AclEntries:
        """Add and remove entries of one resource pattern; the pattern's ACLs after."""
        ...

    def install_acls(self, pattern: acl.ResourcePattern, entries: AclEntries) -> None: ...

    def user_credentials(self) -> Mapping[str, UserCredentials]: ...

    def change_credentials(self, user: str, upsert: Mapping[str, ScramCredential],
                           delete: set[str]) -> UserCredentials:
        """Upsert and delete a user's credentials by mechanism; the user's after."""
        ...

    def install_credentials(self, user: str, creds: UserCredentials) -> None: ...

    # client quotas (issue 12): the same pattern (reads from memory, blocking writes that
    # return what the caller installs on the loop)
    @property
    def quota_table(self) -> QuotaTable: ...

    def change_client_quotas(self, entity: QuotaEntity, upsert: Mapping[str, float],
                             remove: set[str]) -> dict[str, float]:
        """Set and remove an entity's quota keys; the entity's quotas after."""
        ...

    def install_client_quotas(self, entity: QuotaEntity, values: Mapping[str, float]) -> None:
        ...

    # dynamic broker configs and group configs (issue 27): by Kafka's entity path under
    # /config ("brokers/<default>", "brokers/0", "groups/<group>"); the same pattern (reads
    # from memory, blocking writes, the writer installs its result on the loop)
    def entity_configs(self, path: str) -> dict[str, str]: ...

    def entity_config_paths(self, kind: str) -> list[str]:
        """Every stored entity path of a kind ("brokers", "groups")."""
        ...

    def change_entity_configs(self, path: str, configs: Mapping[str, str]) -> None:
        """Replace an entity's configs (empty: remove them)."""
        ...

    def install_entity_configs(self, path: str, configs: Mapping[str, str]) -> None: ...

    def close(self) -> None: ...


class MetadataError(Exception):
    """The metadata is unreadable (a clear message, never a silent reset)."""


class MetadataWriteError(MetadataError):
    """A change could not be persisted (disk full, I/O error). Nothing of it was applied:
    neither the database nor the in-memory view changed."""


def new_cluster_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 chars)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, topic_id TEXT NOT NULL UNIQUE,"
    " configs TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS partitions (topic TEXT NOT NULL, idx INTEGER NOT NULL,"
    " replicas TEXT NOT NULL, leader INTEGER NOT NULL, leader_epoch INTEGER NOT NULL,"
    " isr TEXT NOT NULL, partition_epoch INTEGER NOT NULL, PRIMARY KEY (topic, idx))"
    " WITHOUT ROWID",
    # one row per ACL resource pattern: its entries as Kafka's ZooKeeper JSON
    "CREATE TABLE IF NOT EXISTS acls (resource_type INTEGER NOT NULL, pattern_type INTEGER"
    " NOT NULL, name TEXT NOT NULL, acls TEXT NOT NULL, PRIMARY KEY (resource_type,"
    " pattern_type, name)) WITHOUT ROWID",
    # one row per user and mechanism: Kafka's stored text (salt, keys, iterations)
    "CREATE TABLE IF NOT EXISTS scram_credentials (user TEXT NOT NULL, mechanism TEXT NOT NULL,"
    " credential TEXT NOT NULL, PRIMARY KEY (user, mechanism)) WITHOUT ROWID",
    # one row per client quota entity: Kafka's entity path under /config
    # ("users/alice/clients/app", "clients/<default>", "ips/10.0.0.1") and its quotas as a
    # JSON object {key: value}
    "CREATE TABLE IF NOT EXISTS client_quotas (entity TEXT PRIMARY KEY, quotas TEXT NOT NULL)"
    " WITHOUT ROWID",
    # issue 27: dynamic broker configs and group configs by entity path ("brokers/<default>",
    # "brokers/0", "groups/g"): a JSON object {name: value}
    "CREATE TABLE IF NOT EXISTS entity_configs (entity TEXT PRIMARY KEY, configs TEXT NOT NULL)"
    " WITHOUT ROWID",
)
_INSERT_PARTITION = (
    "INSERT INTO partitions (topic, idx, replicas, leader, leader_epoch, isr, partition_epoch)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)

Tx = Callable[[sqlite3.Connection], object]


def _partition_rows(
    name: str, first: int, partitions: list[PartitionState]
) -> list[tuple[Any, ...]]:
    """Rows for ``partitions``; replica lists are encoded once per distinct list (a big
    topic repeats a handful of them), which keeps a 10,000-partition create's rows cheap."""
    texts: dict[tuple[int, ...], str] = {}

    def text(ids: list[int]) -> str:
        key = tuple(ids)
        t = texts.get(key)
        if t is None:
            t = texts[key] = json.dumps(ids)
        return t

    return [
        (name, first + i, text(p.replicas), p.leader, p.leader_epoch, text(p.isr),
         p.partition_epoch)
        for i, p in enumerate(partitions)
    ]


def _copy(p: PartitionState) -> PartitionState:
    return PartitionState(list(p.replicas), p.leader, p.leader_epoch, list(p.isr),
                          p.partition_epoch)


class LocalMetadataStore:
    """Single-node metadata, persisted in the data dir. See the module docstring."""

    DB_NAME = "headrace-metadata.db"
    FILE_NAME = "headrace-metadata.json"  # the format before SQLite: migrated on first start
    BACKUP_SUFFIX = ".migrated"

    def __init__(self, data_dir: Path, self_broker: BrokerInfo, cluster_id: str = "") -> None:
        self._dir = data_dir
        self._db_path = data_dir / self.DB_NAME
        self._json_path = data_dir / self.FILE_NAME
        self._self = self_broker
        self._topics: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, TopicState] = {}
        self._next_producer_id = 1000
        self._cluster_id = cluster_id
        self._acls = acl.AclIndex()
        self._users: dict[str, UserCredentials] = {}
        self._quotas = QuotaTable()
        self._entity_configs: dict[str, dict[str, str]] = {}
        self._db = self._open(cluster_id)

    # ---------------------------------------------------------------- opening
    def _open(self, cluster_id: str) -> sqlite3.Connection:
        created = not self._db_path.exists()
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
            db = sqlite3.connect(self._db_path, isolation_level=None,
                                 check_same_thread=False)
        except sqlite3.Error as e:
            raise MetadataError(f"cannot open cluster metadata {self._db_path}: {e}") from e
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise MetadataError(f"cannot use WAL mode for {self._db_path} (got {mode})")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=OFF")
            db.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA:
                    db.execute(stmt)
                row = db.execute("SELECT value FROM meta WHERE key='cluster_id'").fetchone()
                if row is None:
                    if self._json_path.exists():
                        self._import_json(db)
                    else:
                        self._cluster_id = cluster_id or new_cluster_id()
                        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
                            ("cluster_id", self._cluster_id),
                            ("next_producer_id", str(self._next_producer_id)),
                        ])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._load(db)
        except sqlite3.Error as e:
            db.close()
            raise MetadataError(f"cannot read cluster metadata {self._db_path}: {e}") from e
        except BaseException:
            db.close()
            raise
        if created:
            fsync_dir(self._dir)
        if self._json_path.exists():  # imported now, or imported before a crash
            os.replace(self._json_path, self._json_path.with_name(
                self.FILE_NAME + self.BACKUP_SUFFIX))
            fsync_dir(self._dir)
        return db

    def _import_json(self, db: sqlite3.Connection) -> None:
        try:
            doc = json.loads(self._json_path.read_text())
            cluster_id = str(doc["cluster_id"])
            next_pid = int(doc["next_producer_id"])
            topics = [TopicState.from_json(str(name), t) for name, t in doc["topics"].items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise MetadataError(
                f"cannot read cluster metadata {self._json_path}: {e}") from e
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [
            ("cluster_id", cluster_id), ("next_producer_id", str(next_pid))])
        for t in topics:
            db.execute("INSERT INTO topics (name, topic_id, configs) VALUES (?, ?, ?)",
                       (t.name, str(t.topic_id), json.dumps(t.configs)))
            db.executemany(_INSERT_PARTITION, _partition_rows(t.name, 0, t.partitions))

    def _load(self, db: sqlite3.Connection) -> None:
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            self._cluster_id = str(meta["cluster_id"])
            self._next_producer_id = int(meta["next_producer_id"])
            topics: dict[str, TopicState] = {}
            for name, topic_id, configs in db.execute(
                    "SELECT name, topic_id, configs FROM topics"):
                topics[name] = TopicState(name, uuid.UUID(topic_id), [], dict(json.loads(configs)))
            for name, idx, replicas, leader, epoch, isr, pepoch in db.execute(
                    "SELECT topic, idx, replicas, leader, leader_epoch, isr, partition_epoch"
                    " FROM partitions ORDER BY topic, idx"):
                t = topics[name]
                if idx != len(t.partitions):
                    raise ValueError(f"topic {name!r} lacks partition {len(t.partitions)}")
                t.partitions.append(PartitionState(
                    json.loads(replicas), int(leader), int(epoch), json.loads(isr), int(pepoch)))
            acls = acl.AclIndex()
            for rtype, ptype, name, text in db.execute(
                    "SELECT resource_type, pattern_type, name, acls FROM acls"):
                acls.set_acls(acl.ResourcePattern(acl.ResourceType(rtype),
                                                  name, acl.PatternType(ptype)),
                              _decode_acls(text))
            users: dict[str, UserCredentials] = {}
            for user, mechanism, text in db.execute(
                    "SELECT user, mechanism, credential FROM scram_credentials"):
                users.setdefault(user, {})[mechanism] = parse_credential(text)
            quotas = QuotaTable()
            for path, text in db.execute("SELECT entity, quotas FROM client_quotas"):
                entity = QuotaEntity.from_path(path)
                quotas.set(entity, stored_quotas(entity, {
                    str(k): str(v) for k, v in dict(json.loads(text)).items()}))
            entity_configs = {
                str(path): {str(k): str(v) for k, v in dict(json.loads(text)).items()}
                for path, text in db.execute("SELECT entity, configs FROM entity_configs")}
        except (ValueError, KeyError, TypeError, QuotaError) as e:
            raise MetadataError(f"cannot read cluster metadata {self._db_path}: {e}") from e
        self._acls = acls
        self._users = users
        self._quotas = quotas
        self._entity_configs = entity_configs
        self._topics = topics
        self._by_id = {t.topic_id: t for t in topics.values()}

    def close(self) -> None:
        self._db.close()

    # ---------------------------------------------------------------- writing
    def _write(self, tx: Tx) -> None:
        """Run ``tx`` in one committed transaction (fsynced: WAL, synchronous=FULL), or
        roll it back and raise ``MetadataWriteError``. Callers change memory only after."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                tx(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise MetadataWriteError(f"cannot write cluster metadata {self._db_path}: {e}") from e
        except OSError as e:
            raise MetadataWriteError(f"cannot write cluster metadata {self._db_path}: {e}") from e

    # ---------------------------------------------------------------- reading
    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def topics(self) -> Mapping[str, TopicState]:
        return self._topics

    def topic(self, name: str) -> TopicState | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        return self._by_id.get(topic_id)

    def partition_count(self) -> int:
        """Partitions of every topic (this single node hosts them all)."""
        return sum(len(t.partitions) for t in self._topics.values())

    # ---------------------------------------------------------------- changing
    def create_topic(
        self, name: str, partitions: list[PartitionState], configs: Mapping[str, str],
        topic_id: uuid.UUID | None = None,
    ) -> TopicState:
        if name in self._topics:
            raise KeyError(name)
        ts = TopicState(name, topic_id or uuid.uuid4(), [_copy(p) for p in partitions],
                        dict(configs))

        def tx(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO topics (name, topic_id, configs) VALUES (?, ?, ?)",
                       (name, str(ts.topic_id), json.dumps(ts.configs)))
            db.executemany(_INSERT_PARTITION, _partition_rows(name, 0, ts.partitions))

        self._write(tx)
        self._topics[name] = ts
        self._by_id[ts.topic_id] = ts
        return ts

    def delete_topic(self, name: str) -> None:
        ts = self._topics[name]

        def tx(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM partitions WHERE topic = ?", (name,))
            db.execute("DELETE FROM topics WHERE name = ?", (name,))

        self._write(tx)
        del self._topics[name]
        self._by_id.pop(ts.topic_id, None)

    def add_partitions(self, name: str, partitions: list[PartitionState]) -> None:
        ts = self._topics[name]
        new = [_copy(p) for p in partitions]
        first = len(ts.partitions)
        self._write(lambda db: db.executemany(
            _INSERT_PARTITION, _partition_rows(name, first, new)))
        ts.partitions.extend(new)

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        ts = self._topics[name]
        new = dict(configs)
        self._write(lambda db: db.execute(
            "UPDATE topics SET configs = ? WHERE name = ?", (json.dumps(new), name)))
        ts.configs = new

    def update_partition(self, name: str, index: int, state: PartitionState) -> None:
        ts = self._topics[name]
        if not 0 <= index < len(ts.partitions):
            raise IndexError(index)
        new = _copy(state)
        self._write(lambda db: db.execute(
            "UPDATE partitions SET replicas = ?, leader = ?, leader_epoch = ?, isr = ?,"
            " partition_epoch = ? WHERE topic = ? AND idx = ?",
            (json.dumps(new.replicas), new.leader, new.leader_epoch, json.dumps(new.isr),
             new.partition_epoch, name, index)))
        ts.partitions[index] = new

    def allocate_producer_ids(self, count: int) -> int:
        first = self._next_producer_id
        after = first + count
        self._write(lambda db: db.execute(
            "UPDATE meta SET value = ? WHERE key = 'next_producer_id'", (str(after),)))
        self._next_producer_id = after
        return first

    def live_brokers(self) -> list[BrokerInfo]:
        return [self._self]

    def controller_id(self) -> int:
        return self._self.node_id

    # ---------------------------------------------------------------- ACLs, credentials
    @property
    def acl_index(self) -> acl.AclIndex:
        return self._acls

    def change_acls(self, pattern: acl.ResourcePattern, add: AclEntries,
                    remove: AclEntries) -> AclEntries:
        current = self._acls.get(pattern)
        new = (current | add) - remove
        if new == current:
            return current
        key = (int(pattern.resource_type), int(pattern.pattern_type), pattern.name)
        if new:
            self._write(lambda db: db.execute(
                "INSERT OR REPLACE INTO acls (resource_type, pattern_type, name, acls)"
                " VALUES (?, ?, ?, ?)", (*key, _encode_acls(new))))
        else:
            self._write(lambda db: db.execute(
                "DELETE FROM acls WHERE resource_type = ? AND pattern_type = ? AND name = ?",
                key))
        self._acls.set_acls(pattern, new)
        return new

    def install_acls(self, pattern: acl.ResourcePattern, entries: AclEntries) -> None:
        self._acls.set_acls(pattern, entries)  # already there: change_acls installed it

    def user_credentials(self) -> Mapping[str, UserCredentials]:
        return self._users

    def change_credentials(self, user: str, upsert: Mapping[str, ScramCredential],
                           delete: set[str]) -> UserCredentials:
        new = {m: c for m, c in self._users.get(user, {}).items() if m not in delete}
        new.update(upsert)

        def tx(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM scram_credentials WHERE user = ? AND mechanism = ?",
                           [(user, m) for m in delete])
            db.executemany("INSERT OR REPLACE INTO scram_credentials (user, mechanism,"
                           " credential) VALUES (?, ?, ?)",
                           [(user, m, format_credential(c)) for m, c in upsert.items()])

        self._write(tx)
        self.install_credentials(user, new)
        return new

    def install_credentials(self, user: str, creds: UserCredentials) -> None:
        if creds:
            self._users[user] = dict(creds)
        else:
            self._users.pop(user, None)


    # ---------------------------------------------------------------- client quotas
    @property
    def quota_table(self) -> QuotaTable:
        return self._quotas

    def change_client_quotas(self, entity: QuotaEntity, upsert: Mapping[str, float],
                             remove: set[str]) -> dict[str, float]:
        current = self._quotas.get(entity)
        new = {k: v for k, v in current.items() if k not in remove}
        new.update(upsert)
        if new == current:
            return current
        if new:
            text = json.dumps(new, sort_keys=True)
            self._write(lambda db: db.execute(
                "INSERT OR REPLACE INTO client_quotas (entity, quotas) VALUES (?, ?)",
                (entity.path, text)))
        else:
            self._write(lambda db: db.execute(
                "DELETE FROM client_quotas WHERE entity = ?", (entity.path,)))
        self._quotas.set(entity, new)
        return new

    def install_client_quotas(self, entity: QuotaEntity, values: Mapping[str, float]) -> None:
        if values != self._quotas.get(entity):
            self._quotas.set(entity, values)


    # ---------------------------------------------------------------- entity configs
    def entity_configs(self, path: str) -> dict[str, str]:
        return dict(self._entity_configs.get(path, {}))

    def entity_config_paths(self, kind: str) -> list[str]:
        return sorted(p for p in self._entity_configs if p.startswith(kind + "/"))

    def change_entity_configs(self, path: str, configs: Mapping[str, str]) -> None:
        new = {str(k): str(v) for k, v in configs.items()}
        if new:
            text = json.dumps(new, sort_keys=True)
            self._write(lambda db: db.execute(
                "INSERT OR REPLACE INTO entity_configs (entity, configs) VALUES (?, ?)",
                (path, text)))
        else:
            self._write(lambda db: db.execute(
                "DELETE FROM entity_configs WHERE entity = ?", (path,)))
        self.install_entity_configs(path, new)

    def install_entity_configs(self, path: str, configs: Mapping[str, str]) -> None:
        if configs:
            self._entity_configs[path] = dict(configs)
        else:
            self._entity_configs.pop(path, None)


def _encode_acls(entries: AclEntries) -> str:
    from headrace.cluster.zk_layout import encode_acls

    return encode_acls(entries).decode()


def _decode_acls(text: str) -> AclEntries:
    from headrace.cluster.zk_layout import decode_acls

    return decode_acls("stored ACLs", text.encode())
