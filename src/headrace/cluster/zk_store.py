"""``ZkMetadataStore``: a cluster's metadata in ZooKeeper (R-REP-9), with kazoo.

Kafka's layout and JSON (``zk_layout``), under the chroot of ``zookeeper.connect``.

Reading: a cache held on the broker's event loop and kept current by ZooKeeper's one-shot
watches, re-armed by every read (Kafka's way). A watch only names a path; one worker
thread ("zk-sync") re-reads the path with a new watch and hands the result to the loop
(``loop.call_soon_threadsafe``), where the cache changes and listeners are told
(``topic_changed`` once per topic per batch, ``brokers_changed``, ``controller_changed``,
``admin_changed``, ``session_lost``, ``session_restored``; docs/cluster.md). So reads from
handlers are plain dict lookups and never block, and kazoo's threads never touch the cache.

ACLs and SCRAM credentials (issue 12), Kafka's way: ``/kafka-acl/<Type>/<name>`` and
``/kafka-acl-extended/prefixed/<Type>/<name>`` hold each resource pattern's ACLs,
``/config/users/<user>`` each user's SCRAM credentials; a writer changes one znode
(conditionally on its version, re-reading on a conflict) and then announces it with a
sequential node (``/kafka-acl-changes``, ``/kafka-acl-extended-changes``,
``/config/changes``). Client quotas the same way: ``/config/users/<user>`` (beside the
credentials), ``/config/users/<user>/clients/<client>``, ``/config/clients/<client>``,
``/config/ips/<ip>``, announced on ``/config/changes`` by entity path. Every broker watches
those three lists and re-reads exactly the resources, users and quota entities named by
notifications it has not seen, so all brokers converge on
the same ACLs within a watch round trip; the writer installs its own result at once.
Notifications past the newest ``NOTIFICATIONS_KEPT`` are removed by writers.

Partition states the same way, instead of Kafka's LeaderAndIsr/UpdateMetadata requests and
without a watch per partition (issue 21, defect 5): every write of a state znode (the
controller's, a leader's ISR change) creates in the same transaction a sequential node
under ``/headrace/state_changes`` carrying the partition, the new state and its version
(its czxid is the state's mzxid). Every broker keeps one child watch there and applies the
notifications it has not seen; states are read directly only with their topic (a new or
changed topic, a full read). The controller removes notifications past the newest
``STATE_CHANGES_KEPT`` (recording the highest removed in the parent's data); a broker that
had not read one of them reads every state again. So the watches grow with brokers and
topics, not brokers x partitions.

Connection and session. A watch lives on one connection to ZooKeeper: the server drops a
connection's watches with it, and kazoo, which does not implement ZooKeeper's SetWatches
(the Java client's re-registration of its watches on a new connection, which Kafka
relies on), forgets its own and fires each with a NONE event (ignored here). So:

- a connection lost and re-established **with the same session** (a blip, a partition
  from ZooKeeper healed within the session timeout) leaves the broker registered but with
  no watch at all: the whole layout is read again (every watch re-armed) and what changed
  meanwhile is told as ordinary change notifications (``topic_changed`` with
  ``changed_partitions``, ``topic_deleted``, ``brokers_changed``, ``controller_changed``,
  ``admin_changed``): nothing is missed, as with SetWatches. One INFO line says so.
- a lost session (expired) fences the broker (``session_lost``); when kazoo reconnects
  with a new session the broker registers again, the whole layout is read again (watches
  re-armed) and ``session_restored`` follows.

A path is marked watched only once its read succeeded, and a failed re-read is queued
again unless the session is lost (then the new session's full read replaces it), so no
path is ever left neither watched nor queued. kazoo reconnects with a backoff capped at
one second (the Java client's), not its default of up to an hour, so a healed partition
is noticed at once.

Writing: blocking methods, called from worker threads (``asyncio.to_thread``). Controller
writes are fenced by the version of ``/controller_epoch`` (a transaction's ``check``), the
leader's ISR writes by the state znode's version. A caller that awaited a write sees it in
the cache once the watch has fired (the broker waits for that where it matters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from headrace.cluster import zk_layout as L
from headrace.config import BrokerConfig
from headrace.metadata.store import (
    AclEntries,
    BrokerInfo,
    MetadataError,
    MetadataWriteError,
    PartitionState,
    TopicState,
    UserCredentials,
    new_cluster_id,
)
from headrace.security import acl
from headrace.security.quotas import (
    QuotaEntity,
    QuotaError,
    QuotaTable,
    format_value,
    stored_quotas,
)
from headrace.security.scram import (
    MECHANISMS,
    ScramCredential,
    format_credential,
    parse_credential,
)

log = logging.getLogger("headrace.zookeeper")

PRODUCER_ID_BLOCK_SIZE = 1000
# kazoo's reconnection backoff (its default grows to an hour between attempts); capped at
# one second like the Java client's, so a broker notices a healed partition at once
RECONNECT = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
NOTIFICATIONS_KEPT = 1000  # change notifications kept per list (older ones are removed)
# partition state change notifications kept (a broker further behind reads every state);
# the controller removes older ones every STATE_CHANGES_PURGE_EVERY notifications. Every
# broker lists them all on each read: at 20,000 kept (when each creation had one of its
# own) a listing took 20 ms of an idle broker and 70 ms of a busy one; creations and
# updates now share notifications, up to STATE_WRITE_BATCH states each
STATE_CHANGES_KEPT = 2_000
STATE_CHANGES_PURGE_EVERY = 500
# the controller's state updates (not creations) go to ZooKeeper this many per transaction,
# with one notification for all: a failover of 10,000 partitions is 100 transactions and
# 100 notifications for each broker to read, not 10,000 (ZooKeeper wrote ~60-80 of the
# single ones per second under the brokers' listings of the notifications)
STATE_WRITE_BATCH = 100
_EXTENDED = {L.ACL_CHANGES: False, L.ACL_EXTENDED_CHANGES: True}


class ControllerMovedError(Exception):
    """A controller write found ``/controller_epoch`` changed: another controller."""


class ReassignmentInProgressError(Exception):
    """CreatePartitions while a partition of the topic is being reassigned."""


class TopicExistsError(Exception):
    pass


def _announced(result: Any) -> int:
    """The sequence number of a state change notification a transaction created (-1: not
    created)."""
    return L.sequence_number(result) if isinstance(result, str) else -1


def split_connect(connect: str) -> tuple[str, str]:
    """``host:port,host:port/chroot`` -> (hosts, chroot or "")."""
    i = connect.find("/")
    if i < 0:
        return connect, ""
    chroot = connect[i:].rstrip("/")
    return connect[:i], chroot


class ZkMetadataStore:
    def __init__(self, config: BrokerConfig, self_broker: BrokerInfo,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.self_broker = self_broker
        self.loop = loop
        # the listener brokers reach each other on (the same name on every broker): other
        # brokers' host and port in ``live_brokers`` are theirs on it
        self.inter_broker_listener = "PLAINTEXT"  # set by the broker
        self.hosts, self.chroot = split_connect(str(config["zookeeper.connect"]))
        self.session_timeout_s = int(config["zookeeper.session.timeout.ms"]) / 1000
        self.connection_timeout_s = int(config["zookeeper.connection.timeout.ms"]) / 1000
        self.client: KazooClient | None = None
        self._listeners: list[Any] = []
        # the cache (event loop only)
        self._cluster_id = ""
        self._assign: dict[str, L.TopicAssignment] = {}
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._configs: dict[str, dict[str, str]] = {}
        self._topics: dict[str, TopicState] = {}
        self._by_id: dict[uuid.UUID, str] = {}
        self._brokers: dict[int, BrokerInfo] = {}
        # broker id -> broker epoch: the czxid of its /brokers/ids/N registration (Kafka's
        # broker epoch); a broker that registered again has a new one
        self._broker_epochs: dict[int, int] = {}
        # the zxid of each partition state's last write (what the controller compares
        # with a leader's broker epoch: a state older than its leader's registration)
        self._state_mzxids: dict[tuple[str, int], int] = {}
        self._controller = -1
        self._controller_epoch = 0
        self._deletions: list[str] = []
        self._shutdowns: list[int] = []
        self._reassign_request: list[tuple[str, int, list[int]]] = []
        self._preferred: list[tuple[str, int]] = []
        self._acls = acl.AclIndex()
        self._users: dict[str, UserCredentials] = {}
        self._quotas = QuotaTable()
        # dynamic broker configs (this broker's and the default) and group configs by
        # entity path (issue 27)
        self._entity_configs: dict[str, dict[str, str]] = {}
        # the newest change notification read per list (sync worker / start only)
        self._seen_changes: dict[str, int] = {}
        # the sync worker
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._queued_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._session_lost = False
        self._watches_lost = False  # the connection dropped: no watch is left
        self._watched_topics: set[str] = set()
        # during a topic_changed notification: the partitions whose state changed (None:
        # the whole topic may have changed)
        self.changed_partitions: dict[str, set[int] | None] = {}
        self._last_purge = -1  # the newest state change when notifications were last removed

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Connect, register this broker, read the whole layout; raises MetadataError."""
        await asyncio.to_thread(self._connect)
        self._cluster_id = await asyncio.to_thread(self._cluster_id_node)
        configured = str(self.config["cluster.id"])
        if configured and configured != self._cluster_id:
            self.close()
            raise MetadataError(f"cluster.id {configured} does not match ZooKeeper's "
                                f"{self._cluster_id}")
        await asyncio.to_thread(self._register)
        snapshot = await asyncio.to_thread(self._read_all)
        self._install_snapshot(snapshot, "start")
        self._worker = threading.Thread(target=self._work, name="zk-sync", daemon=True)
        self._worker.start()
        log.info("registered broker %d in ZooKeeper %s%s (cluster %s, %d topics, "
                 "%d brokers)", self.self_broker.node_id, self.hosts, self.chroot,
                 self._cluster_id, len(self._topics), len(self._brokers))

    def _connect(self) -> None:
        try:
            if self.chroot:
                bare = KazooClient(hosts=self.hosts, timeout=self.session_timeout_s)
                bare.start(timeout=self.connection_timeout_s)
                try:
                    bare.ensure_path(self.chroot)
                finally:
                    bare.stop()
                    bare.close()
            client = KazooClient(hosts=self.hosts + self.chroot, timeout=self.session_timeout_s,
                                 connection_retry=RECONNECT)
            client.start(timeout=self.connection_timeout_s)
        except (KazooTimeoutError, KazooException, OSError) as e:
            raise MetadataError(f"cannot reach ZooKeeper at {self.hosts}: {e or 'timed out'}"
                                ) from None
        for path in (L.PERSISTENT_PATHS + L.SECURITY_PATHS + L.QUOTA_PATHS
                     + L.ENTITY_CONFIG_PATHS):
            client.ensure_path(path)
        client.add_listener(self._state_changed)
        self.client = client

    def _cluster_id_node(self) -> str:
        assert self.client is not None
        with contextlib.suppress(NodeExistsError):
            self.client.create(L.CLUSTER_ID, L.encode_cluster_id(
                str(self.config["cluster.id"]) or new_cluster_id()), makepath=True)
        data, _ = self.client.get(L.CLUSTER_ID)
        return L.decode_cluster_id(data)

    def _register(self) -> None:
        """Create ``/brokers/ids/<id>`` (ephemeral). A node left by an earlier session of
        this broker (a kill -9 moments ago) is waited out, up to the session timeout."""
        assert self.client is not None
        me = self.self_broker
        path = L.broker_path(me.node_id)
        data = L.encode_broker(me, int(time.time() * 1000))
        deadline = time.monotonic() + self.session_timeout_s + 5
        said = False
        while True:
            try:
                self.client.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                stat = self.client.exists(path)
                if stat is not None and stat.ephemeralOwner == self.client.client_id[0]:
                    return
                if time.monotonic() > deadline:
                    raise MetadataError(
                        f"broker id {me.node_id} is registered by another live broker") from None
                if not said:
                    said = True
                    log.info("broker id %d is still registered by an earlier session; "
                             "waiting for it to expire", me.node_id)
                time.sleep(0.2)

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()

    @property
    def connected(self) -> bool:
        """Whether the ZooKeeper connection is up now (kazoo's CONNECTED state)."""
        client = self.client
        return client is not None and client.state == KazooState.CONNECTED

    def add_listener(self, listener: Any) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------ watches and reads
    def _state_changed(self, state: str) -> None:  # kazoo's thread
        if self._closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            self.loop.call_soon_threadsafe(self._notify, "session_lost")
        elif state == KazooState.SUSPENDED:
            self._watches_lost = True  # kazoo drops every watch with the connection
            log.warning("ZooKeeper connection lost; reconnecting (the session lasts %.1f s "
                        "without one)", self.session_timeout_s)
        elif state == KazooState.CONNECTED:
            if self._session_lost:
                self._session_lost = self._watches_lost = False
                self._enqueue("session", "")
            elif self._watches_lost:
                self._watches_lost = False
                self._enqueue("resync", "")

    def _enqueue(self, kind: str, path: str) -> None:
        key = (kind, path)
        with self._queued_lock:
            if key in self._queued:
                return
            self._queued.add(key)
        self._queue.put(key)

    def _watch(self, kind: str, path: str) -> Any:
        def fired(event: Any) -> None:
            if not self._closed and event.type != "NONE":
                self._enqueue(kind, path)
        return fired

    def _work(self) -> None:
        """Re-read what watches named, in batches: everything queued is drained, the state
        change notifications are read pipelined, and the loop gets one update for the whole
        batch (a controller writing 3,000 states costs a few loop passes, not 3,000). When a read
        fails (connection trouble), what was read is still handed over and what was not
        is queued again after a pause, unless the session is lost: then the new session's
        full read replaces it."""
        while True:
            item = self._queue.get()
            if item is None or self._closed:
                return
            batch = [item]
            while len(batch) < 10_000:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    return
                batch.append(nxt)
            with self._queued_lock:
                for key in batch:
                    self._queued.discard(key)
            if ("session", "") in batch:  # it reads everything again too
                batch = [key for key in batch if key != ("resync", "")]
            updates: list[tuple[str, Any]] = []
            failed: list[tuple[str, str]] = []
            error: Exception | None = None
            for kind, path in batch:
                if error is not None:  # the connection is in trouble: all later
                    failed.append((kind, path))
                    continue
                try:
                    updates += self._refresh(kind, path)
                except Exception as e:
                    error = e
                    failed.append((kind, path))
            if updates and not self._closed:
                self.loop.call_soon_threadsafe(self._apply, updates)
            if error is None:
                continue
            if self._closed:
                return
            log.warning("re-reading %d path(s) from ZooKeeper failed: %s", len(failed),
                        f"{type(error).__name__}: {error}" if str(error)
                        else type(error).__name__)
            time.sleep(0.2)
            if not self._session_lost:
                for kind, path in failed:
                    self._enqueue(kind, path)

    def _read_states(self, paths: list[str]) -> list[tuple[str, Any]]:
        assert self.client is not None
        pending = [(path, self.client.get_async(path)) for path in paths]
        out: list[tuple[str, Any]] = []
        for path, res in pending:
            _, _, _, name, _, p, _ = path.split("/")
            try:
                data, stat = res.get(timeout=self.session_timeout_s)
                out.append(("state", (name, int(p), data, stat.version, stat.mzxid)))
            except NoNodeError:  # its creation will be announced
                out.append(("state", (name, int(p), None, -1, -1)))
        return out

    def _get(self, path: str, kind: str) -> bytes | None:
        """Data of ``path`` with a data watch (or an exists watch if it is missing)."""
        assert self.client is not None
        try:
            data, _ = self.client.get(path, watch=self._watch(kind, path))
            return bytes(data)
        except NoNodeError:
            if self.client.exists(path, watch=self._watch(kind, path)) is not None:
                return self._get(path, kind)
            return None

    def _children(self, path: str, kind: str) -> list[str]:
        """Children of ``path`` with a child watch (or an exists watch if it is missing:
        never a path left unwatched)."""
        assert self.client is not None
        try:
            return list(self.client.get_children(path, watch=self._watch(kind, path)))
        except NoNodeError:
            if self.client.exists(path, watch=self._watch(kind, path)) is not None:
                return self._children(path, kind)
            return []

    def _list(self, path: str) -> list[str]:
        """Children of ``path`` without a watch."""
        assert self.client is not None
        try:
            return list(self.client.get_children(path))
        except NoNodeError:
            return []

    def _refresh(self, kind: str, path: str) -> list[tuple[str, Any]]:
        """Re-read one path (re-arming its watch); the updates for the loop."""
        assert self.client is not None
        if kind == "session":
            self._register()
            return [("session", self._read_all())]
        if kind == "resync":  # the same session: still registered, but no watch is left
            return [("resync", self._read_all())]
        if kind == "brokers":
            return [("brokers", self._read_brokers())]
        if kind == "topics":
            names = self._children(L.TOPICS, "topics")
            for name in names:  # new topics: each its own read (retried on its own)
                if name not in self._watched_topics:
                    self._enqueue("topic", L.topic_path(name))
            return [("topic_names", names)]
        if kind == "topic":
            return self._read_topic(path.rsplit("/", 1)[1])
        if kind == "state_changes":
            return self._read_state_changes()
        if kind == "config":
            name = path.rsplit("/", 1)[1]
            return [("config", (name, self._get(path, "config")))]
        if kind == "controller":
            return [("controller", self._get(L.CONTROLLER, "controller"))]
        if kind == "controller_epoch":
            return [("controller_epoch", self._get(L.CONTROLLER_EPOCH, "controller_epoch"))]
        if kind == "delete_topics":
            return [("delete_topics", self._children(L.DELETE_TOPICS, "delete_topics"))]
        if kind == "controlled_shutdown":
            return [("controlled_shutdown",
                     self._children(L.CONTROLLED_SHUTDOWN, "controlled_shutdown"))]
        if kind == "reassign":
            return [("reassign", self._get(L.REASSIGN_PARTITIONS, "reassign"))]
        if kind == "preferred":
            return [("preferred", self._get(L.PREFERRED_ELECTION, "preferred"))]
        if kind == "acl_changes":
            return self._read_acl_changes(path)
        if kind == "config_changes":
            return self._read_config_changes()
        return []

    def _state_changes_start(self) -> None:
        """Take every state change so far as seen (a full read follows) and watch."""
        assert self.client is not None
        nodes = self._children(L.STATE_CHANGES, "state_changes")
        data, _ = self.client.get(L.STATE_CHANGES)
        newest = max((L.sequence_number(n) for n in nodes), default=-1)
        self._seen_changes[L.STATE_CHANGES] = max(newest, L.decode_purged(data))

    def _read_state_changes(self) -> list[tuple[str, Any]]:
        """The partition states announced since the last read (re-arms the one watch).
        If some were removed before this broker read them, every state is read again."""
        assert self.client is not None
        seen = self._seen_changes.get(L.STATE_CHANGES, -1)
        nodes = self._new_changes(L.STATE_CHANGES, "state_changes")
        data, _ = self.client.get(L.STATE_CHANGES)
        if seen < L.decode_purged(data):
            return self._reread_states()
        pending = [self.client.get_async(f"{L.STATE_CHANGES}/{n}") for n in nodes]
        out: list[tuple[str, Any]] = []
        for res in pending:
            try:
                raw, stat = res.get(timeout=self.session_timeout_s)
            except NoNodeError:  # removed since listed: read everything
                return self._reread_states()
            try:
                changes = L.read_state_changes(raw)
            except L.LayoutError as e:
                log.warning("ignoring a state change notification: %s", e)
                continue
            # its czxid is the state writes' zxid (one transaction)
            out += [("state", (topic, p, state, version, int(stat.czxid)))
                    for topic, p, version, state in changes]
        return out

    def _reread_states(self) -> list[tuple[str, Any]]:
        log.info("state change notifications were removed before this broker read them: "
                 "reading every partition state again")
        out: list[tuple[str, Any]] = []
        for name in sorted(self._watched_topics):
            out += self._read_topic(name)
        return out

    def _purge_state_changes(self, newest: int) -> None:
        """Remove state change notifications older than the last STATE_CHANGES_KEPT (the
        highest removed goes in the parent's data first: a reader behind it reads all)."""
        c = self._c()
        old = [n for n in self._list(L.STATE_CHANGES)
               if 0 <= L.sequence_number(n) <= newest - STATE_CHANGES_KEPT]
        if not old:
            return
        c.set(L.STATE_CHANGES, str(max(L.sequence_number(n) for n in old)).encode())
        for res in [c.delete_async(f"{L.STATE_CHANGES}/{n}") for n in old]:
            with contextlib.suppress(NoNodeError):
                res.get(timeout=max(self.session_timeout_s, 10))

    def _new_changes(self, path: str, kind: str) -> list[str]:
        """Notifications of ``path`` not seen yet, oldest first (re-arms the watch)."""
        nodes = sorted(self._children(path, kind), key=L.sequence_number)
        seen = self._seen_changes.get(path, -1)
        new = [n for n in nodes if L.sequence_number(n) > seen]
        if nodes:
            self._seen_changes[path] = max(seen, L.sequence_number(nodes[-1]))
        return new

    def _read_acl_changes(self, path: str) -> list[tuple[str, Any]]:
        assert self.client is not None
        patterns: set[acl.ResourcePattern] = set()
        for node in self._new_changes(path, "acl_changes"):
            try:
                data, _ = self.client.get(f"{path}/{node}")
                patterns.add(L.decode_acl_change(_EXTENDED[path], data))
            except NoNodeError:
                continue
            except L.LayoutError as e:
                log.warning("ignoring ACL change notification %s: %s", node, e)
        return [("acl", (p, self._read_acl(p))) for p in sorted(patterns)]

    def _read_config_changes(self) -> list[tuple[str, Any]]:
        assert self.client is not None
        paths: set[str] = set()
        for node in self._new_changes(L.CONFIG_CHANGES, "config_changes"):
            try:
                data, _ = self.client.get(f"{L.CONFIG_CHANGES}/{node}")
                paths.add(L.decode_config_change(data))
            except NoNodeError:
                continue
            except L.LayoutError as e:
                log.warning("ignoring config change notification %s: %s", node, e)
        out: list[tuple[str, Any]] = []
        for path in sorted(paths):
            if L.is_entity_config(path):
                if self._wants_entity(path):
                    out.append(("entity_config", (path, self._read_entity(path)[0])))
                continue
            try:
                entity = QuotaEntity.from_path(path)
            except QuotaError:
                continue  # a topic's or broker's config: read through their own watches
            if entity.user is not None and entity.client_id is None and \
                    isinstance(entity.user, str):
                out.append(("user", (entity.user, self._read_user(entity.user)[0])))
            out.append(("quota", (entity, self._read_quota(entity)[0])))
        return out

    def _read_quota(self, entity: QuotaEntity) -> tuple[dict[str, float], dict[str, str], int]:
        """(the entity's quotas, its whole config map, znode version or -1)."""
        assert self.client is not None
        path = L.quota_path(entity.path)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return {}, {}, -1
        try:
            config = L.decode_config(path, data)
        except L.LayoutError as e:
            log.warning("ignoring quota config: %s", e)
            return {}, {}, stat.version
        return stored_quotas(entity, config), config, stat.version

    def _read_all_quotas(self) -> list[tuple[QuotaEntity, dict[str, float]]]:
        entities: list[QuotaEntity] = []
        for root, kind in ((L.CONFIG_USERS, "users"), (L.CONFIG_CLIENTS, "clients"),
                           (L.CONFIG_IPS, "ips")):
            for child in self._list(root):
                try:
                    entities.append(QuotaEntity.from_path(f"{kind}/{child}"))
                except QuotaError:
                    continue
                if kind == "users":
                    for c in self._list(f"{root}/{child}/clients"):
                        with contextlib.suppress(QuotaError):
                            entities.append(QuotaEntity.from_path(
                                f"users/{child}/clients/{c}"))
        out = []
        for entity in entities:
            values = self._read_quota(entity)[0]
            if values:
                out.append((entity, values))
        return out

    def _wants_entity(self, path: str) -> bool:
        """Entity configs this broker keeps: its own and the default broker configs, and
        every group's."""
        return path.startswith("groups/") or path in (
            L.broker_entity(None), L.broker_entity(self.self_broker.node_id))

    def _read_entity(self, path: str) -> tuple[dict[str, str], int]:
        """(an entity's configs, znode version or -1)."""
        assert self.client is not None
        try:
            data, stat = self.client.get(L.quota_path(path))
        except NoNodeError:
            return {}, -1
        try:
            return L.decode_config(path, data), stat.version
        except L.LayoutError as e:
            log.warning("ignoring dynamic config: %s", e)
            return {}, stat.version

    def _read_all_entities(self) -> dict[str, dict[str, str]]:
        out = {}
        paths = [L.broker_entity(None), L.broker_entity(self.self_broker.node_id)]
        paths += [f"groups/{g}" for g in self._list(L.CONFIG_GROUPS)]
        for path in paths:
            configs = self._read_entity(path)[0]
            if configs:
                out[path] = configs
        return out

    def _read_acl(self, p: acl.ResourcePattern) -> AclEntries:
        assert self.client is not None
        try:
            data, _ = self.client.get(L.acl_path(p))
        except NoNodeError:
            return frozenset()
        try:
            return L.decode_acls(L.acl_path(p), data)
        except L.LayoutError as e:
            log.warning("ignoring ACLs: %s", e)
            return frozenset()

    def _read_user(self, user: str) -> tuple[UserCredentials, dict[str, str], int]:
        """(SCRAM credentials, the whole config, znode version or -1)."""
        assert self.client is not None
        try:
            data, stat = self.client.get(L.user_path(user))
        except NoNodeError:
            return {}, {}, -1
        try:
            config = L.decode_config(f"user {user}", data)
        except L.LayoutError as e:
            log.warning("ignoring user config: %s", e)
            return {}, {}, stat.version
        creds: UserCredentials = {}
        for mechanism in MECHANISMS:
            if mechanism in config:
                try:
                    creds[mechanism] = parse_credential(config[mechanism])
                except ValueError as e:
                    log.warning("ignoring %s credential of %s: %s", mechanism, user, e)
        return creds, config, stat.version

    def _read_security(self) -> dict[str, Any]:
        """Every ACL and user (the change lists first, so nothing slips between)."""
        assert self.client is not None
        for path in _EXTENDED:
            self._new_changes(path, "acl_changes")
        self._new_changes(L.CONFIG_CHANGES, "config_changes")
        acls: list[tuple[acl.ResourcePattern, AclEntries]] = []
        for pt in (acl.PatternType.LITERAL, acl.PatternType.PREFIXED):
            root = L.acl_root(pt)
            for type_name in self._list(root):
                for name in self._list(f"{root}/{type_name}"):
                    try:
                        p = L.acl_pattern(pt, type_name, name)
                    except L.LayoutError as e:
                        log.warning("ignoring ACLs: %s", e)
                        continue
                    acls.append((p, self._read_acl(p)))
        users = {}
        for child in self._list(L.CONFIG_USERS):
            user = L.desanitize(child)
            creds = self._read_user(user)[0]
            if creds:
                users[user] = creds
        return {"acls": acls, "users": users, "quotas": self._read_all_quotas(),
                "entity_configs": self._read_all_entities()}

    def _read_brokers(self) -> tuple[dict[int, BrokerInfo], dict[int, int]]:
        """The registered brokers and their broker epochs (each registration's czxid)."""
        assert self.client is not None
        out = {}
        epochs = {}
        for child in self._children(L.BROKER_IDS, "brokers"):
            try:
                data, stat = self.client.get(f"{L.BROKER_IDS}/{child}")
                out[int(child)] = L.decode_broker(int(child), data, self.inter_broker_listener)
                epochs[int(child)] = int(stat.czxid)
            except NoNodeError:
                continue
            except (ValueError, L.LayoutError) as e:
                log.warning("ignoring broker registration %s: %s", child, e)
        return out, epochs

    def _read_topic(self, name: str) -> list[tuple[str, Any]]:
        """A topic's assignment and config (watched) and the state of partitions not
        watched yet (their watches then keep them current). Each is marked watched only
        once its read succeeded: a read that fails is retried whole."""
        assert self.client is not None
        data = self._get(L.topic_path(name), "topic")
        out: list[tuple[str, Any]] = [("topic", (name, data))]
        if data is None:
            self._watched_topics.discard(name)
            return out
        out.append(("config", (name, self._get(L.config_path(name), "config"))))
        try:
            assignment = L.decode_topic(name, data)
        except L.LayoutError:
            self._watched_topics.add(name)
            return out
        # pipelined reads, no watch: thousands of partitions load in one round of
        # requests, and every later write of a state is announced in STATE_CHANGES
        out += self._read_states([L.state_path(name, p) for p in assignment.partitions])
        self._watched_topics.add(name)
        return out

    def _read_all(self) -> dict[str, Any]:
        assert self.client is not None
        self._watched_topics.clear()
        # the state changes first: one written while the states below are read is then
        # announced after what is taken as seen
        self._state_changes_start()
        snap: dict[str, Any] = {"brokers": self._read_brokers()}
        names = self._children(L.TOPICS, "topics")
        snap["topic_names"] = names
        snap["topics"] = []
        for name in names:
            snap["topics"] += self._read_topic(name)
        snap["controller"] = self._get(L.CONTROLLER, "controller")
        snap["controller_epoch"] = self._get(L.CONTROLLER_EPOCH, "controller_epoch")
        snap["delete_topics"] = self._children(L.DELETE_TOPICS, "delete_topics")
        snap["controlled_shutdown"] = self._children(L.CONTROLLED_SHUTDOWN,
                                                     "controlled_shutdown")
        snap["reassign"] = self._get(L.REASSIGN_PARTITIONS, "reassign")
        snap["preferred"] = self._get(L.PREFERRED_ELECTION, "preferred")
        snap["security"] = self._read_security()
        return snap

    # ------------------------------------------------------------------ the cache (loop)
    def _install_snapshot(self, snap: dict[str, Any], how: str) -> None:
        """The whole layout as read by ``_read_all``. ``how``: "start" (no listener is
        told), "session" (a new session: ``session_restored``, then every topic that
        changed, the brokers and the controller), "resync" (the same session after a
        reconnect: only what differs from the cache, as ordinary change notifications)."""
        before = dict(self._topics)  # TopicStates are rebuilt below, never changed in place
        before_brokers, before_controller = self._brokers, self._controller
        before_epochs = self._broker_epochs
        before_admin = {"delete_topics": self._deletions,
                        "controlled_shutdown": self._shutdowns,
                        "reassign_partitions": self._reassign_request,
                        "preferred_replica_election": self._preferred}
        self._assign.clear()
        self._states.clear()
        self._state_mzxids.clear()
        self._configs.clear()
        self._topics = {}
        self._by_id = {}
        updates: list[tuple[str, Any]] = [("brokers", snap["brokers"]),
                                          ("topic_names", snap["topic_names"])]
        updates += snap["topics"]
        for kind in ("controller", "controller_epoch", "delete_topics", "controlled_shutdown",
                     "reassign", "preferred"):
            updates.append((kind, snap[kind]))
        self._apply(updates, notify=False)
        security = snap["security"]
        self._acls.clear()
        for pattern, entries in security["acls"]:
            self._acls.set_acls(pattern, entries)
        self._users = dict(security["users"])
        quotas = QuotaTable()
        for entity, values in security["quotas"]:
            quotas.set(entity, values)
        self._quotas = quotas
        before_entities, self._entity_configs = self._entity_configs, dict(
            security["entity_configs"])
        if how != "start":
            for path in sorted(set(before_entities) | set(self._entity_configs)):
                if before_entities.get(path) != self._entity_configs.get(path):
                    self._notify("entity_configs_changed", path)
        if how == "session":
            self._notify("session_restored")
            for name in set(before) | set(self._topics):
                if name not in self._topics:
                    self._notify("topic_deleted", name)
                elif before.get(name) != self._topics[name]:
                    self._notify("topic_changed", name)
            self._notify("brokers_changed")
            self._notify("controller_changed", self._controller)
        elif how == "resync":
            self._notify_differences(before, before_brokers, before_controller, before_admin,
                                     before_epochs)

    def _notify_differences(self, before: dict[str, TopicState],
                            brokers: dict[int, BrokerInfo], controller: int,
                            admin: dict[str, Any], epochs: dict[int, int]) -> None:
        """After a re-read on the same session: tell what differs from the cache as it
        was, as the watches would have (SetWatches' effect), and say so in one line."""
        deleted = sorted(n for n in before if n not in self._topics)
        changed: dict[str, set[int] | None] = {}
        for name, t in self._topics.items():
            old = before.get(name)
            if old == t:
                continue
            if (old is None or old.topic_id != t.topic_id or old.configs != t.configs
                    or len(old.partitions) != len(t.partitions)
                    or any(a.replicas != b.replicas
                           for a, b in zip(old.partitions, t.partitions, strict=True))):
                changed[name] = None  # the whole topic
            else:
                changed[name] = {i for i, (a, b) in enumerate(
                    zip(old.partitions, t.partitions, strict=True)) if a != b}
        now_admin = {"delete_topics": self._deletions,
                     "controlled_shutdown": self._shutdowns,
                     "reassign_partitions": self._reassign_request,
                     "preferred_replica_election": self._preferred}
        admin_changed = [k for k in now_admin if now_admin[k] != admin[k]]
        brokers_moved = brokers != self._brokers or epochs != self._broker_epochs
        log.info("ZooKeeper connection re-established with the same session: its watches "
                 "had gone with the connection, everything was read again (watches "
                 "re-armed); changed meanwhile: %d topic(s), %d deleted%s%s%s",
                 len(changed), len(deleted),
                 ", the brokers" if brokers_moved else "",
                 f", the controller ({controller} -> {self._controller})"
                 if controller != self._controller else "",
                 "".join(f", {k}" for k in admin_changed))
        for name in deleted:
            self._notify("topic_deleted", name)
        self.changed_partitions = dict(changed)
        try:
            for name in sorted(changed):
                self._notify("topic_changed", name)
        finally:
            self.changed_partitions = {}
        if brokers_moved:
            self._notify("brokers_changed")
        if controller != self._controller:
            self._notify("controller_changed", self._controller)
        for kind in admin_changed:
            self._notify("admin_changed", kind)

    def _apply(self, updates: list[tuple[str, Any]], notify: bool = True) -> None:
        if self._closed:
            return
        changed: set[str] = set()  # the whole topic (assignment, config)
        changed_parts: dict[str, set[int]] = {}  # partition states only
        deleted: set[str] = set()
        events: list[tuple[str, Any]] = []
        for kind, value in updates:
            if kind in ("session", "resync"):
                self._install_snapshot(value, kind)
                continue
            if kind == "brokers":
                brokers, epochs = value
                if brokers != self._brokers or epochs != self._broker_epochs:
                    # a bounce (a broker registered again, kill -9 and restart) changes
                    # only its epoch: the controller must hear of it (bouncedBrokerIds)
                    self._brokers, self._broker_epochs = brokers, epochs
                    events.append(("brokers_changed", None))
            elif kind == "topic_names":
                for name in list(self._assign):
                    if name not in value:
                        deleted.add(name)
                        self._drop_topic(name)
            elif kind == "topic":
                name, data = value
                if data is None:
                    if name in self._assign:
                        deleted.add(name)
                        self._drop_topic(name)
                    continue
                try:
                    self._assign[name] = L.decode_topic(name, data)
                except L.LayoutError as e:
                    log.warning("ignoring topic znode: %s", e)
                    continue
                changed.add(name)
            elif kind == "state":
                name, p, data, version, mzxid = value
                if data is None:
                    self._states.pop((name, p), None)
                    self._state_mzxids.pop((name, p), None)
                else:
                    try:
                        # bytes of a state znode, or a notification's fields (or the error
                        # reading them: L.read_state_changes)
                        if isinstance(data, L.LayoutError):
                            raise data
                        leader, epoch, isr, cepoch = (
                            data if isinstance(data, tuple)
                            else L.decode_state(f"state of {name}-{p}", data))
                    except L.LayoutError as e:
                        log.warning("ignoring partition state: %s", e)
                        continue
                    old = self._states.get((name, p))
                    old_zxid = self._state_mzxids.get((name, p), -1)
                    if old is not None and (
                            mzxid < old_zxid if mzxid >= 0 and old_zxid >= 0
                            else old.zk_version > version):
                        # an older read arriving late (by zxid when both are known: a
                        # notification about a deleted topic's partition may come after
                        # the new topic's state, whose version restarted at 0)
                        continue
                    self._states[(name, p)] = PartitionState(
                        [], leader, epoch, isr, epoch, cepoch, version)
                    self._state_mzxids[(name, p)] = mzxid
                changed_parts.setdefault(name, set()).add(p)
            elif kind == "config":
                name, data = value
                try:
                    self._configs[name] = L.decode_config(name, data)
                except L.LayoutError as e:
                    log.warning("ignoring topic config: %s", e)
                    continue
                changed.add(name)
            elif kind == "controller":
                try:
                    cid = L.decode_controller(value)
                except L.LayoutError:
                    cid = -1
                if cid != self._controller:
                    self._controller = cid
                    events.append(("controller_changed", cid))
            elif kind == "controller_epoch":
                with contextlib.suppress(L.LayoutError):
                    self._controller_epoch = L.decode_controller_epoch(value)
            elif kind == "delete_topics":
                self._deletions = sorted(value)
                events.append(("admin_changed", "delete_topics"))
            elif kind == "controlled_shutdown":
                self._shutdowns = sorted(int(x) for x in value if x.isdigit())
                events.append(("admin_changed", "controlled_shutdown"))
            elif kind == "reassign":
                try:
                    self._reassign_request = L.decode_reassignment(value)
                except L.LayoutError as e:
                    log.warning("ignoring reassignment request: %s", e)
                    self._reassign_request = []
                events.append(("admin_changed", "reassign_partitions"))
            elif kind == "acl":
                self.install_acls(*value)
            elif kind == "user":
                self.install_credentials(*value)
            elif kind == "quota":
                self.install_client_quotas(*value)
            elif kind == "entity_config":
                path, configs = value
                if configs != self._entity_configs.get(path, {}):
                    self.install_entity_configs(path, configs)
                    events.append(("entity_configs_changed", path))
            elif kind == "preferred":
                try:
                    self._preferred = L.decode_preferred(value)
                except L.LayoutError as e:
                    log.warning("ignoring preferred election request: %s", e)
                    self._preferred = []
                events.append(("admin_changed", "preferred_replica_election"))
        for name in changed - deleted:
            self._rebuild(name)
        for name, parts in changed_parts.items():
            if name not in changed and name not in deleted:
                self._update_partitions(name, parts)
        if not notify:
            return
        for name in sorted(deleted):
            self._notify("topic_deleted", name)
        self.changed_partitions = {n: None for n in changed}
        for n, parts in changed_parts.items():
            if n not in changed:
                self.changed_partitions[n] = parts
        try:
            for name in sorted((changed | set(changed_parts)) - deleted):
                if name in self._topics:
                    self._notify("topic_changed", name)
        finally:
            self.changed_partitions = {}
        for method, arg in events:
            if arg is None:
                self._notify(method)
            else:
                self._notify(method, arg)

    def _drop_topic(self, name: str) -> None:
        log.debug("topic %s is gone from ZooKeeper", name)
        self._assign.pop(name, None)
        self._configs.pop(name, None)
        for key in [k for k in self._states if k[0] == name]:
            del self._states[key]
            self._state_mzxids.pop(key, None)
        t = self._topics.pop(name, None)
        if t is not None:
            self._by_id.pop(t.topic_id, None)

    def _update_partitions(self, name: str, parts: set[int]) -> None:
        """New states of some partitions of a known topic (no full rebuild: a controller
        writing thousands of states must not cost thousands of rebuilds)."""
        t = self._topics.get(name)
        a = self._assign.get(name)
        if t is None or a is None or len(t.partitions) != len(a.partitions):
            self._rebuild(name)
            return
        for p in parts:
            if not 0 <= p < len(t.partitions):
                continue
            st = self._states.get((name, p))
            replicas = list(a.partitions[p])
            t.partitions[p] = (PartitionState(replicas, -1, -1, [], 0, -1, -1) if st is None
                               else PartitionState(replicas, st.leader, st.leader_epoch,
                                                   list(st.isr), st.partition_epoch,
                                                   st.controller_epoch, st.zk_version))

    def _rebuild(self, name: str) -> None:
        a = self._assign.get(name)
        if a is None:
            return
        parts = []
        for p in range(len(a.partitions)):
            replicas = list(a.partitions[p])
            st = self._states.get((name, p))
            if st is None:
                parts.append(PartitionState(replicas, -1, -1, [], 0, -1, -1))
            else:
                parts.append(PartitionState(replicas, st.leader, st.leader_epoch, list(st.isr),
                                            st.partition_epoch, st.controller_epoch,
                                            st.zk_version))
        t = TopicState(name, a.topic_id, parts, dict(self._configs.get(name, {})))
        self._topics[name] = t
        self._by_id[a.topic_id] = name

    def _notify(self, method: str, *args: Any) -> None:
        for listener in list(self._listeners):
            fn = getattr(listener, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("metadata listener %s.%s failed", type(listener).__name__, method)

    # ------------------------------------------------------------------ MetadataStore reads
    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def topics(self) -> Mapping[str, TopicState]:
        return self._topics

    def topic(self, name: str) -> TopicState | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        name = self._by_id.get(topic_id)
        return None if name is None else self._topics.get(name)

    def live_brokers(self) -> list[BrokerInfo]:
        return [self._brokers[k] for k in sorted(self._brokers)]

    def broker_epochs(self) -> Mapping[int, int]:
        """Registered broker id -> its broker epoch (the registration's czxid)."""
        return self._broker_epochs

    def state_mzxid(self, topic: str, partition: int) -> int:
        """The zxid of the partition state's last write as read (-1: not known)."""
        return self._state_mzxids.get((topic, partition), -1)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._brokers.get(node_id)

    def controller_id(self) -> int:
        return self._controller

    def controller_epoch(self) -> int:
        return self._controller_epoch

    def reassignments(self) -> dict[str, tuple[dict[int, list[int]], dict[int, list[int]]]]:
        return {n: (a.adding, a.removing) for n, a in self._assign.items()
                if a.adding or a.removing}

    def pending_deletions(self) -> list[str]:
        return list(self._deletions)

    def preferred_election_requests(self) -> list[tuple[str, int]]:
        return list(self._preferred)

    def controlled_shutdown_requests(self) -> list[int]:
        return list(self._shutdowns)

    def reassign_partitions_request(self) -> list[tuple[str, int, list[int]]]:
        return list(self._reassign_request)

    # ------------------------------------------------------------------ writes (blocking)
    def _c(self) -> KazooClient:
        if self.client is None:
            raise MetadataError("not connected to ZooKeeper")
        return self.client

    def create_topic_znodes(self, name: str, assignment: list[list[int]],
                            configs: Mapping[str, str], topic_id: uuid.UUID) -> None:
        c = self._c()
        t = c.transaction()
        if c.exists(L.config_path(name)) is None:
            t.create(L.config_path(name), L.encode_config(dict(configs)))
        else:
            t.set_data(L.config_path(name), L.encode_config(dict(configs)))
        t.create(L.topic_path(name), L.encode_topic(topic_id, dict(enumerate(assignment))))
        for r in t.commit():
            if isinstance(r, NodeExistsError):
                raise TopicExistsError(name)
            if isinstance(r, Exception) and type(r).__name__ != "RolledBackError":
                raise MetadataError(f"creating topic {name} in ZooKeeper: {r!r}")

    def add_partition_znodes(self, name: str, full_assignment: list[list[int]]) -> None:
        """Append the partitions of ``full_assignment`` past the topic's current ones;
        the existing partitions keep the znode's replicas (the controller's, not a cache's
        that may be older). Refused while a partition of the topic is being reassigned
        (``ReassignmentInProgressError``, as Kafka refuses CreatePartitions then)."""
        c = self._c()
        data, stat = c.get(L.topic_path(name))
        a = L.decode_topic(name, data)
        if a.adding or a.removing:
            raise ReassignmentInProgressError(
                f"A partition reassignment of topic '{name}' is in progress.")
        if len(full_assignment) <= len(a.partitions):
            raise MetadataError(f"topic '{name}' has {len(a.partitions)} partitions already")
        assignment = dict(a.partitions)
        for i in range(len(a.partitions), len(full_assignment)):
            assignment[i] = list(full_assignment[i])
        c.set(L.topic_path(name), L.encode_topic(a.topic_id, assignment), version=stat.version)

    def set_topic_config_znode(self, name: str, configs: Mapping[str, str]) -> None:
        c = self._c()
        data = L.encode_config(dict(configs))
        try:
            c.set(L.config_path(name), data)
        except NoNodeError:
            c.create(L.config_path(name), data, makepath=True)

    def request_topic_deletion(self, name: str) -> None:
        with contextlib.suppress(NodeExistsError):
            self._c().create(f"{L.DELETE_TOPICS}/{name}", makepath=True)

    def request_controlled_shutdown(self, broker_id: int) -> None:
        with contextlib.suppress(NodeExistsError):
            self._c().create(f"{L.CONTROLLED_SHUTDOWN}/{broker_id}", ephemeral=True,
                             makepath=True)

    def update_isr(self, topic: str, partition: int, state: PartitionState) -> int | None:
        """A leader's conditional ISR change; the new znode version, None if someone else
        changed the state first.

        A write whose answer was lost with the connection may have been applied: it is sent
        again once kazoo has reconnected (within the session), and a BadVersion is then
        checked against what the znode holds — our own leader, epoch and ISR mean it was
        ours (Kafka's ``conditionalUpdatePath`` with its data checker). Only the session's
        expiry (the broker is fenced then) ends the retries with an exception; a change
        is never reported failed while it may be in ZooKeeper."""
        path = L.state_path(topic, partition)
        data = L.encode_state(state, state.controller_epoch)

        def attempt() -> int | None:
            c = self._c()
            t = c.transaction()
            t.set_data(path, data, version=state.zk_version)
            self._announce_state(t, topic, partition, state.zk_version + 1, data)
            results = t.commit()
            first = results[0]
            if not isinstance(first, Exception):
                return int(first.version)
            if isinstance(first, NoNodeError):
                return None
            if isinstance(first, BadVersionError):
                current, stat = c.get(path)
                mine = L.decode_state(path, data)[:3]
                return int(stat.version) if L.decode_state(path, current)[:3] == mine else None
            raise next((r for r in results if isinstance(r, Exception)
                        and type(r).__name__ != "RolledBackError"), first)

        retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, ignore_expire=False,
                           deadline=max(self.session_timeout_s * 2, 10.0))
        version: int | None = retry(attempt)
        return version

    def update_isrs(self, items: list[tuple[str, int, PartitionState]]) -> list[int | None]:
        """Leaders' ISR changes, many at once (Kafka's ``AlterPartitionManager`` sends every
        queued change in one AlterPartition request): STATE_WRITE_BATCH conditional sets to
        a transaction with one notification naming all of them, the transactions pipelined.
        A transaction refused as a whole (one of its partitions changed meanwhile) or left
        without an answer is done again one partition at a time with ``update_isr``, which
        tells a lost race from our own applied write; per item the new version or None,
        as ``update_isr``."""
        if len(items) == 1:
            return [self.update_isr(*items[0])]
        c = self._c()
        out: list[int | None] = [None] * len(items)
        again: list[int] = []
        batches: list[tuple[list[int], Any]] = []
        try:
            for k in range(0, len(items), STATE_WRITE_BATCH):
                idx = list(range(k, min(k + STATE_WRITE_BATCH, len(items))))
                t = c.transaction()
                changes = []
                for i in idx:
                    topic, part, st = items[i]
                    data = L.encode_state(st, st.controller_epoch)
                    t.set_data(L.state_path(topic, part), data, version=st.zk_version)
                    changes.append((topic, part, st.zk_version + 1, data))
                t.create(f"{L.STATE_CHANGES}/{L.STATE_CHANGE_PREFIX}",
                         L.encode_state_changes(changes), sequence=True)
                batches.append((idx, t.commit_async()))
        except KazooException:
            pass  # the batches not sent are done one by one below
        sent = {i for idx, _ in batches for i in idx}
        again += [i for i in range(len(items)) if i not in sent]
        for idx, res in batches:
            try:
                results = res.get(timeout=max(self.session_timeout_s, 10))
            except Exception:  # no answer: applied or not, update_isr finds out
                again += idx
                continue
            if any(isinstance(r, Exception) for r in results):
                again += idx  # one refused: each alone, to know which
                continue
            for i, r in zip(idx, results[:-1], strict=True):
                out[i] = int(r.version)
        for i in sorted(again):
            out[i] = self.update_isr(*items[i])
        return out

    def allocate_producer_ids(self, count: int) -> int:
        """The first id of a new block of at least ``count`` (Kafka's
        ``/latest_producer_id_block``, a conditional write). ZooKeeper unreachable (the
        connection lost, the session gone) raises ``MetadataWriteError``."""
        try:
            return self._allocate_producer_ids(count)
        except (KazooException, KazooTimeoutError) as e:
            raise MetadataWriteError(
                f"reserving producer ids in ZooKeeper failed: {type(e).__name__}") from None

    def _allocate_producer_ids(self, count: int) -> int:
        c = self._c()
        size = max(count, PRODUCER_ID_BLOCK_SIZE)
        while True:
            try:
                data, stat = c.get(L.PRODUCER_ID_BLOCK)
            except NoNodeError:
                try:
                    c.create(L.PRODUCER_ID_BLOCK, L.encode_producer_id_block(
                        self.self_broker.node_id, 0, size - 1))
                    return 0
                except NodeExistsError:
                    continue
            start = L.decode_producer_id_block(data) + 1
            try:
                c.set(L.PRODUCER_ID_BLOCK, L.encode_producer_id_block(
                    self.self_broker.node_id, start, start + size - 1), version=stat.version)
                return start
            except BadVersionError:
                continue

    # ---- controller writes
    def elect_controller(self, broker_id: int) -> tuple[int, int] | None:
        c = self._c()
        try:
            c.create(L.CONTROLLER, L.encode_controller(broker_id, int(time.time() * 1000)),
                     ephemeral=True)
        except NodeExistsError:
            return None
        while True:
            try:
                data, stat = c.get(L.CONTROLLER_EPOCH)
            except NoNodeError:
                try:
                    c.create(L.CONTROLLER_EPOCH, b"1")
                    _, stat = c.get(L.CONTROLLER_EPOCH)
                    return 1, int(stat.version)
                except NodeExistsError:
                    continue
            epoch = L.decode_controller_epoch(data) + 1
            try:
                stat = c.set(L.CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
                return epoch, int(stat.version)
            except BadVersionError:
                continue

    def resign_controller(self, broker_id: int) -> None:
        c = self.client
        if c is None:
            return
        with contextlib.suppress(KazooException):
            data, _ = c.get(L.CONTROLLER)
            if L.decode_controller(data) == broker_id:
                c.delete(L.CONTROLLER)

    def write_partition_states(self, updates: list[tuple[str, int, PartitionState]],
                               controller_epoch: int, epoch_zk_version: int
                               ) -> list[int | None]:
        """Create or conditionally set each state znode in a transaction with a check of
        ``/controller_epoch``'s version (pipelined). Creations and updates go
        STATE_WRITE_BATCH to a transaction with one notification for all of them; a batch
        refused as a whole (one BadVersion, a partition's node already there) is tried
        again one partition per transaction.
        ControllerMovedError if the check failed; per update the new version or None
        (BadVersion: re-decide)."""
        c = self._c()
        out: list[int | None] = [None] * len(updates)
        moved = False
        newest = -1
        singles: list[int] = []
        parents_known: set[str] = set()
        gone: set[str] = set()
        sets = [i for i, (_, _, st) in enumerate(updates) if st.zk_version >= 0]
        creates = [i for i, (_, _, st) in enumerate(updates) if st.zk_version < 0]
        if len(creates) > 1:  # the topics' partitions parents first, once per topic
            for topic in dict.fromkeys(updates[i][0] for i in creates):
                parents_known.add(topic)
                self._create_partitions_parent(topic, gone)
            singles += [i for i in creates if updates[i][0] in gone]
            creates = [i for i in creates if updates[i][0] not in gone]
        # updates, and creations, in transactions of STATE_WRITE_BATCH with one
        # notification each (a topic of 1,000 partitions is 10 notifications, not 1,000)
        batches: list[tuple[list[int], Any]] = []
        own: list[tuple[str, Any]] = []  # the states written, for this broker's cache
        for group in (sets, creates):
            if len(group) < 2:
                singles += group
                continue
            for k in range(0, len(group), STATE_WRITE_BATCH):
                idx = group[k:k + STATE_WRITE_BATCH]
                t = c.transaction()
                t.check(L.CONTROLLER_EPOCH, epoch_zk_version)
                changes = []
                for i in idx:
                    topic, p, st = updates[i]
                    data = L.encode_state(st, controller_epoch)
                    if st.zk_version < 0:
                        t.create(L.partition_path(topic, p))
                        t.create(L.state_path(topic, p), data)
                    else:
                        t.set_data(L.state_path(topic, p), data, version=st.zk_version)
                    changes.append((topic, p, st.zk_version + 1, data))
                t.create(f"{L.STATE_CHANGES}/{L.STATE_CHANGE_PREFIX}",
                         L.encode_state_changes(changes), sequence=True)
                batches.append((idx, t.commit_async()))
        for idx, res in batches:
            results = res.get(timeout=max(self.session_timeout_s, 10))
            first = results[0]
            if isinstance(first, Exception) and type(first).__name__ != "RolledBackError":
                moved = True  # fenced: nothing written
            elif any(isinstance(r, Exception) for r in results):
                # one refused (BadVersion; a partition's node left by an earlier attempt):
                # each alone, to know which
                singles += idx
            else:
                newest = max(newest, _announced(results[-1]))
                if updates[idx[0]][2].zk_version < 0:
                    for i in idx:
                        out[i] = 0
                else:
                    for i, r in zip(idx, results[1:-1], strict=True):
                        out[i] = int(r.version)
                        topic, p, st = updates[i]
                        own.append(("state", (topic, p, (st.leader, st.leader_epoch,
                                                         list(st.isr), controller_epoch),
                                              int(r.version), int(r.mzxid))))
        if own and not self._closed:
            # this broker's own cache takes what its controller wrote at once, as Kafka's
            # controller sends LeaderAndIsr to its own broker too: the notifications follow
            # and change nothing (same zxid). Read back from ZooKeeper by this broker's
            # busy loop, a failover's elections took effect here 0.1-1.3 s after the
            # other brokers' (bench/cluster_bench.py --scale 30000)
            self.loop.call_soon_threadsafe(self._apply, own)
        singles.sort()
        if moved:
            raise ControllerMovedError("the controller epoch changed")
        pending: list[tuple[str, int, PartitionState, bytes, Any]] = []
        for topic, p, st in [updates[i] for i in singles]:
            path = L.state_path(topic, p)
            data = L.encode_state(st, controller_epoch)
            t = c.transaction()
            t.check(L.CONTROLLER_EPOCH, epoch_zk_version)
            if st.zk_version < 0:
                if topic not in parents_known:  # once per topic, not once per partition
                    parents_known.add(topic)
                    self._create_partitions_parent(topic, gone)
                if topic in gone:
                    pending.append((topic, p, st, data, None))
                    continue
                t.create(L.partition_path(topic, p))
                t.create(path, data)
                self._announce_state(t, topic, p, 0, data)
            else:
                t.set_data(path, data, version=st.zk_version)
                self._announce_state(t, topic, p, st.zk_version + 1, data)
            pending.append((topic, p, st, data, t.commit_async()))
        single_out: list[int | None] = []
        for topic, p, st, data, res in pending:
            if res is None:  # its topic is gone: nothing written
                single_out.append(None)
                continue
            results = res.get(timeout=max(self.session_timeout_s, 10))
            newest = max(newest, _announced(results[-1]))
            first, last = results[0], results[-2]  # last: the state's write
            if isinstance(first, Exception) and type(first).__name__ != "RolledBackError":
                moved = True
                single_out.append(None)
            elif st.zk_version < 0 and isinstance(results[1], NodeExistsError):
                # the partition's node exists (a retry after a partial failure): the state
                # alone, still fenced
                t = c.transaction()
                t.check(L.CONTROLLER_EPOCH, epoch_zk_version)
                t.create(L.state_path(topic, p), data)
                self._announce_state(t, topic, p, 0, data)
                r = t.commit()
                if isinstance(r[0], Exception) and type(r[0]).__name__ != "RolledBackError":
                    moved = True
                newest = max(newest, _announced(r[-1]))
                single_out.append(None if isinstance(r[-1], Exception) else 0)
            elif isinstance(last, Exception):
                single_out.append(None)
            elif isinstance(last, str):  # create returns the path
                single_out.append(0)
            else:
                single_out.append(int(last.version))
        for i, r in zip(singles, single_out, strict=True):
            out[i] = r
        if newest >= 0 and (newest // STATE_CHANGES_PURGE_EVERY
                            != self._last_purge // STATE_CHANGES_PURGE_EVERY):
            self._last_purge = newest
            try:
                self._purge_state_changes(newest)
            except KazooException as e:
                log.warning("removing old state change notifications failed: %s", e)
        if moved:
            raise ControllerMovedError("the controller epoch changed")
        return out

    def _create_partitions_parent(self, topic: str, gone: set[str]) -> None:
        """``/brokers/topics/T/partitions``, unless it exists; T is added to ``gone`` if
        the topic's znode is gone. Never recursive: a topic deleted meanwhile must not
        come back as an empty /brokers/topics/T (a cache that still had it made new
        states)."""
        try:
            self._c().create(L.partitions_path(topic))
        except NodeExistsError:
            pass
        except NoNodeError:
            gone.add(topic)

    def read_partition_states(self, tps: list[tuple[str, int]]
                              ) -> list[PartitionState | None]:
        """The state znodes of ``tps`` as they are now, pipelined, no watch (the
        controller's re-read of the partitions whose writes were refused); None: no znode.
        The replicas are left empty (the caller knows the assignment)."""
        c = self._c()
        pending = [(tp, c.get_async(L.state_path(*tp))) for tp in tps]
        out: list[PartitionState | None] = []
        for (topic, p), res in pending:
            try:
                data, stat = res.get(timeout=max(self.session_timeout_s, 10))
            except NoNodeError:
                out.append(None)
                continue
            leader, epoch, isr, cepoch = L.decode_state(f"state of {topic}-{p}", data)
            out.append(PartitionState([], leader, epoch, isr, epoch, cepoch, int(stat.version)))
        return out

    @staticmethod
    def _announce_state(t: Any, topic: str, p: int, version: int, data: bytes) -> None:
        """In the state write's transaction: its notification (L.STATE_CHANGES)."""
        t.create(f"{L.STATE_CHANGES}/{L.STATE_CHANGE_PREFIX}",
                 L.encode_state_change(topic, p, version, data), sequence=True)

    def write_topic_assignment(self, name: str, assignment: dict[int, list[int]],
                               adding: dict[int, list[int]], removing: dict[int, list[int]],
                               epoch_zk_version: int) -> None:
        c = self._c()
        data, _ = c.get(L.topic_path(name))
        a = L.decode_topic(name, data)
        t = c.transaction()
        t.check(L.CONTROLLER_EPOCH, epoch_zk_version)
        t.set_data(L.topic_path(name), L.encode_topic(a.topic_id, assignment, adding, removing))
        results = t.commit()
        if isinstance(results[0], Exception):
            raise ControllerMovedError("the controller epoch changed")

    def delete_topic_znodes(self, name: str, epoch_zk_version: int) -> None:
        c = self._c()
        paths: list[str] = []
        try:
            for p in c.get_children(L.partitions_path(name)):
                base = f"{L.partitions_path(name)}/{p}"
                paths += [f"{x}" for x in (f"{base}/{k}" for k in c.get_children(base))]
                paths.append(base)
            paths.append(L.partitions_path(name))
        except NoNodeError:
            pass
        if c.exists(L.topic_path(name)) is not None:
            paths.append(L.topic_path(name))
        if c.exists(L.config_path(name)) is not None:
            paths.append(L.config_path(name))
        t = c.transaction()
        t.check(L.CONTROLLER_EPOCH, epoch_zk_version)
        for path in paths:
            t.delete(path)
        results = t.commit()
        if results and isinstance(results[0], Exception) and \
                type(results[0]).__name__ != "RolledBackError":
            raise ControllerMovedError("the controller epoch changed")
        if any(isinstance(r, (NotEmptyError, NoNodeError)) for r in results):
            # something was added meanwhile: delete what is there, then retry the rest
            raise MetadataError(f"deleting topic {name}'s znodes raced; retry")
        with contextlib.suppress(NoNodeError):
            c.delete(f"{L.DELETE_TOPICS}/{name}")

    # ------------------------------------------------------------------ ACLs, credentials
    @property
    def acl_index(self) -> acl.AclIndex:
        return self._acls

    def install_acls(self, pattern: acl.ResourcePattern, entries: AclEntries) -> None:
        """On the loop: one resource pattern's ACLs as just written or read."""
        self._acls.set_acls(pattern, entries)

    def user_credentials(self) -> Mapping[str, UserCredentials]:
        return self._users

    def install_credentials(self, user: str, creds: UserCredentials) -> None:
        if creds:
            self._users[user] = dict(creds)
        else:
            self._users.pop(user, None)

    def change_acls(self, pattern: acl.ResourcePattern, add: AclEntries,
                    remove: AclEntries) -> AclEntries:
        """Blocking (worker thread): read-modify-write of the pattern's znode, conditional
        on its version (retried on a conflict), removed when no ACL is left; then the
        change notification. Returns the pattern's ACLs after the write."""
        c = self._c()
        path = L.acl_path(pattern)
        while True:
            try:
                data, stat = c.get(path)
                current, version = L.decode_acls(path, data), stat.version
            except NoNodeError:
                current, version = frozenset(), -1
            new = (current | add) - remove
            if new == current:
                return current
            try:
                if not new:
                    c.delete(path, version=version)
                elif version < 0:
                    c.create(path, L.encode_acls(new), makepath=True)
                else:
                    c.set(path, L.encode_acls(new), version=version)
            except (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError):
                continue  # someone else changed it meanwhile: read again
            break
        changes = (L.ACL_CHANGES if pattern.pattern_type is acl.PatternType.LITERAL
                   else L.ACL_EXTENDED_CHANGES)
        self._announce(changes, L.ACL_CHANGE_PREFIX, L.encode_acl_change(pattern))
        return new

    def change_credentials(self, user: str, upsert: Mapping[str, ScramCredential],
                           delete: set[str]) -> UserCredentials:
        """Blocking (worker thread): ``/config/users/<user>`` rewritten (its other configs
        kept), conditional on its version; then ``/config/changes`` is told."""
        path = L.user_path(user)
        while True:
            creds, config, version = self._read_user(user)
            new_config = {k: v for k, v in config.items() if k not in delete}
            new_config.update({m: format_credential(cred) for m, cred in upsert.items()})
            new = {m: cr for m, cr in creds.items() if m not in delete}
            new.update(upsert)
            if new_config == config and version >= 0:
                return new
            if self._write_config(path, new_config, version):
                break
        self._announce(L.CONFIG_CHANGES, L.CONFIG_CHANGE_PREFIX, L.encode_user_change(user))
        return new

    @property
    def quota_table(self) -> QuotaTable:
        return self._quotas

    def install_client_quotas(self, entity: QuotaEntity, values: Mapping[str, float]) -> None:
        """On the loop: one entity's quotas as just written or read."""
        if values != self._quotas.get(entity):
            self._quotas.set(entity, values)

    def change_client_quotas(self, entity: QuotaEntity, upsert: Mapping[str, float],
                             remove: set[str]) -> dict[str, float]:
        """Blocking (worker thread): the entity's znode rewritten with its other keys kept
        (a user's SCRAM credentials), conditional on its version (re-read on a conflict);
        then ``/config/changes`` names the entity path."""
        path = L.quota_path(entity.path)
        while True:
            current, config, version = self._read_quota(entity)
            new = {k: v for k, v in current.items() if k not in remove}
            new.update(upsert)
            new_config = {k: v for k, v in config.items()
                          if k not in remove and k not in upsert}
            new_config.update({k: format_value(entity, k, v) for k, v in upsert.items()})
            if new_config == config and version >= 0:
                return new
            if self._write_config(path, new_config, version):
                break
        self._announce(L.CONFIG_CHANGES, L.CONFIG_CHANGE_PREFIX,
                       L.encode_entity_change(entity.path))
        return new

    def entity_configs(self, path: str) -> dict[str, str]:
        return dict(self._entity_configs.get(path, {}))

    def entity_config_paths(self, kind: str) -> list[str]:
        return sorted(p for p in self._entity_configs if p.startswith(kind + "/"))

    def install_entity_configs(self, path: str, configs: Mapping[str, str]) -> None:
        """On the loop: one entity's configs as just written or read."""
        if configs:
            self._entity_configs[path] = dict(configs)
        else:
            self._entity_configs.pop(path, None)

    def change_entity_configs(self, path: str, configs: Mapping[str, str]) -> None:
        """Blocking (worker thread): ``/config/<path>`` rewritten, conditional on its version
        (re-read on a conflict), then announced on ``/config/changes`` (every broker re-reads
        it: the default broker configs apply everywhere)."""
        new = {str(k): str(v) for k, v in configs.items()}
        while True:
            current, version = self._read_entity(path)
            if current == new and version >= 0:
                return
            if self._write_config(L.quota_path(path), new, version):
                break
        self._announce(L.CONFIG_CHANGES, L.CONFIG_CHANGE_PREFIX, L.encode_entity_change(path))

    def _write_config(self, path: str, config: dict[str, str], version: int) -> bool:
        """``config`` written to the config znode ``path`` if it is still at ``version``
        (created if -1); False if someone else changed it meanwhile (read it again)."""
        c = self._c()
        try:
            if version < 0:
                c.create(path, L.encode_config(config), makepath=True)
            else:
                c.set(path, L.encode_config(config), version=version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            return False
        return True

    def _announce(self, root: str, prefix: str, data: bytes) -> None:
        """A sequential change notification; notifications older than the newest
        ``NOTIFICATIONS_KEPT`` are removed."""
        c = self._c()
        created = c.create(f"{root}/{prefix}", data, sequence=True)
        newest = L.sequence_number(str(created))
        for node in self._list(root):
            if 0 <= L.sequence_number(node) <= newest - NOTIFICATIONS_KEPT:
                with contextlib.suppress(NoNodeError):
                    c.delete(f"{root}/{node}")

    def delete_admin_node(self, path: str) -> None:
        with contextlib.suppress(NoNodeError):
            self._c().delete(path)

    # ------------------------------------------------------------------ MetadataStore writes
    def create_topic(self, name: str, partitions: list[PartitionState],
                     configs: Mapping[str, str], topic_id: uuid.UUID | None = None
                     ) -> TopicState:
        tid = topic_id or uuid.uuid4()
        self.create_topic_znodes(name, [p.replicas for p in partitions], configs, tid)
        return TopicState(name, tid, partitions, dict(configs))

    def delete_topic(self, name: str) -> None:
        self.request_topic_deletion(name)

    def add_partitions(self, name: str, partitions: list[PartitionState]) -> None:
        t = self._topics.get(name)
        current = [p.replicas for p in t.partitions] if t is not None else []
        self.add_partition_znodes(name, current + [p.replicas for p in partitions])

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        self.set_topic_config_znode(name, configs)

    def update_partition(self, name: str, index: int, state: PartitionState) -> None:
        self.update_isr(name, index, state)
