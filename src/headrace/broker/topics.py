"""Topic administration shared by CreateTopics, auto-creation, CreatePartitions and configs.

Pure decisions (name rules, replica assignment) are plain functions; ``TopicAdmin`` applies
them to the metadata store and the replica manager. Errors are ``TopicError`` carrying the
Kafka error code and a message for the response's ``error_message``.

Creating a topic (or partitions) is all or nothing: everything is validated first
(including ``max.broker.partitions``, for a whole request at once), then the partition
directories are created and their logs opened (in a worker thread for CreateTopics and
CreatePartitions, so the event loop keeps serving other clients), then the metadata is
committed (one SQLite transaction: the commit point), then the logs are installed. A
failure at any step removes what the earlier steps made, so no topic is ever left in
memory, in the store or on disk half-created; a crash before the commit leaves only
directories of a topic the metadata does not know, which a later create of that name
removes before it starts (a new topic never adopts old files).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from headrace.broker.replica_manager import ReplicaManager, TopicPartition, partition_dir
from headrace.config import (
    ACCEPTED_TOPIC_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigDef,
    ConfigError,
    parse_overrides,
)
from headrace.log.partition_log import PartitionLog
from headrace.metadata.store import MetadataError, MetadataStore, PartitionState, TopicState

log = logging.getLogger("headrace.topics")

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# Kafka's Topic.INTERNAL_TOPICS (Metadata's is_internal; no partitions added): the
# compacted two above and __share_group_state (KIP-932, cleanup.policy=delete, pruned by
# the share coordinator)
KAFKA_INTERNAL_TOPICS = INTERNAL_TOPICS | {"__share_group_state"}
MAX_PARTITIONS = 100_000  # per topic, per request
INSTALL_CHUNK = 1000  # partitions made live per event-loop turn


class TopicError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


def validate_topic_name(name: str | None) -> str:
    """Kafka's rules (``Topic.validate``)."""
    if not name:
        raise TopicError(ErrorCode.invalid_topic_exception, "Topic name is empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"Topic name cannot be {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is longer than {MAX_NAME_LENGTH} characters",
        )
    if not _LEGAL.match(name):
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name {name!r} is illegal: only ASCII alphanumerics, '.', '_' and '-'",
        )
    return name


def collision_key(name: str) -> str | None:
    """Kafka's ``Topic.unifyCollisionChars``: metric names turn '.' into '_', so two topics
    whose names differ only there would collide. None for a name with neither."""
    return name.replace(".", "_") if "." in name or "_" in name else None


def assign_replicas(
    brokers: list[int], num_partitions: int, replication_factor: int, start: int = 0
) -> list[list[int]]:
    """Round-robin replica assignment: leaders spread evenly (R-REP-1)."""
    if replication_factor > len(brokers):
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            f"Replication factor: {replication_factor} larger than available brokers: "
            f"{len(brokers)}.",
        )
    n = len(brokers)
    ordered = sorted(brokers)
    return [
        [ordered[(start + p + r) % n] for r in range(replication_factor)]
        for p in range(num_partitions)
    ]


def validate_configs(raw: Mapping[str, Any], topic: str | None = None) -> dict[str, str]:
    """Topic config overrides as canonical strings; TopicError(INVALID_CONFIG) if bad,
    in Kafka's words (``LogConfig.validateNames``, ``ConfigDef``'s ``ConfigException``;
    for AlterConfigs on ``topic``, ZooKeeper-mode Kafka's prefix naming the resource).
    Kafka 3.9's deprecated topic configs are accepted (``DEPRECATED_TOPIC_CONFIGS``)."""
    for name in raw:
        if name not in ACCEPTED_TOPIC_CONFIGS:
            raise TopicError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
    nulls = [name for name, value in raw.items() if value is None]
    if nulls:
        raise TopicError(ErrorCode.invalid_config,
                         "Null value not supported for topic configs: " + ",".join(nulls))
    try:
        parsed = parse_overrides(raw, ACCEPTED_TOPIC_CONFIGS)
    except ConfigError as e:
        message = e.kafka_message
        if topic is not None:
            message = (f"Invalid config value for resource ConfigResource(type=TOPIC, "
                       f"name='{topic}'): {message}")
        raise TopicError(ErrorCode.invalid_config, message) from None
    return {k: ACCEPTED_TOPIC_CONFIGS[k].to_string(v) for k, v in parsed.items()}


def check_internal_configs(name: str, overrides: Mapping[str, str],
                           broker: BrokerConfig) -> None:
    """TopicError(INVALID_CONFIG) if ``overrides`` (validated, canonical) would let
    retention delete the records of internal topic ``name``.

    ``__consumer_offsets`` and ``__transaction_state`` hold every group's committed offsets
    and every transactional id's state as the latest record per key: only compaction may
    remove their records. Their effective ``cleanup.policy`` (the override, else the
    broker's ``log.cleanup.policy``) must stay exactly ``compact``; with ``delete`` in it,
    ``retention.ms`` / ``retention.bytes`` remove whole segments and a restart (which
    replays the topic) forgets the commits. Kafka's brokers accept such a change; headrace
    refuses it (README, "Durability and hostile clients"). Every other config may change
    (retention is inert under ``compact``)."""
    if name not in INTERNAL_TOPICS:
        return
    policy = overrides.get("cleanup.policy")
    if policy is None:
        policy = str(broker.topic_default("cleanup.policy"))
    if [p for p in policy.split(",") if p] != ["compact"]:
        raise TopicError(
            ErrorCode.invalid_config,
            f"Internal topic {name} must keep cleanup.policy=compact (asked: "
            f"cleanup.policy={policy}): with delete, retention would remove committed "
            "state that compaction keeps")


def config_def(name: str) -> ConfigDef | None:
    return TOPIC_CONFIGS.get(name)


@dataclass(slots=True)
class TopicSpec:
    """One topic of a CreateTopics request, as the handler parsed it."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, Any] = field(default_factory=dict)
    assignment: list[list[int]] | None = None


@dataclass(slots=True)
class TopicPlan:
    """A validated topic, ready to create: nothing of it exists yet."""

    name: str
    states: list[PartitionState]
    overrides: dict[str, str]
    # chosen up front, so partition directories carry it from their creation
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)

    @property
    def replication_factor(self) -> int:
        return len(self.states[0].replicas)


Outcome = TopicState | TopicPlan | TopicError
T = TypeVar("T")


def _storage_error(what: str, e: BaseException) -> TopicError:
    """What a create that could not be made on disk answers (KAFKA_STORAGE_ERROR, as Kafka
    answers for a failed log directory; retriable: it works once the disk is fixed)."""
    log.error("%s failed, nothing created: %s: %s", what, type(e).__name__, e)
    return TopicError(ErrorCode.kafka_storage_error, f"{what} failed: {e}")


async def _to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` shielded: a request cancelled (its client gone, the broker stopping)
    does not cut a create in half; the create finishes or undoes itself on its own, and
    its outcome is logged if nobody is left to read it."""
    task = asyncio.ensure_future(coro)

    def settle(t: asyncio.Future[T]) -> None:
        if not t.cancelled() and t.exception() is not None:
            log.info("a create finished after its request was cancelled: %s", t.exception())

    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(settle)
        raise


class TopicAdmin:
    def __init__(
        self, config: BrokerConfig, metadata: MetadataStore, replicas: ReplicaManager
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.replicas = replicas
        # topics being created off the event loop -> their partition count (names and
        # partitions are taken from the moment a request is validated)
        self._reserved: dict[str, int] = {}
        self._busy: set[str] = set()  # topics gaining partitions off the event loop
        self._growing: asyncio.Lock | None = None  # CreatePartitions requests, one at a time
        # a cluster member's ClusterNode: topics are created in ZooKeeper and every replica
        # opens its own logs when its metadata cache shows them (docs/cluster.md)
        self.cluster: Any = None
        self._auto_creating: set[str] = set()

    # ------------------------------------------------------------------ limits
    def hosted_partitions(self) -> int:
        """Partitions this broker hosts or is about to (creates in flight)."""
        topics = self.metadata.topics().values()
        if self.cluster is None:  # a single node hosts every partition
            n = sum(len(t.partitions) for t in topics)
        else:
            node = self.replicas.node_id
            n = sum(1 for t in topics for p in t.partitions if node in p.replicas)
        return n + sum(self._reserved.values())

    def check_partition_limit(self, adding: int) -> None:
        """``max.broker.partitions`` (KIP-578): refuse, before anything is created, a change
        that would take this broker past it. Kafka answers a refused oversized operation
        with POLICY_VIOLATION (a PolicyViolationException for the admin client)."""
        limit = int(self.config["max.broker.partitions"])
        have = self.hosted_partitions()
        if have + adding > limit:
            raise TopicError(
                ErrorCode.policy_violation,
                f"Adding {adding} partition(s) would take this broker to {have + adding} "
                f"partitions, past max.broker.partitions={limit}; nothing was created.",
            )

    # ------------------------------------------------------------------ create
    def _collisions(self) -> dict[str, str]:
        """Collision key → a topic holding it, over existing and reserved topics."""
        out: dict[str, str] = {}
        for name in (*self.metadata.topics(), *self._reserved):
            key = collision_key(name)
            if key is not None:
                out.setdefault(key, name)
        return out

    def plan(self, spec: TopicSpec, collisions: Mapping[str, str] | None = None) -> TopicPlan:
        """Validate one topic (name, existence, a name colliding with an existing one once
        '.' and '_' are equated, partitions, replicas, configs). ``collisions``: from
        ``_collisions`` (computed here when not given)."""
        name = validate_topic_name(spec.name)
        if self.metadata.topic(name) is not None or name in self._reserved:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        key = collision_key(name)
        if key is not None:
            other = (self._collisions() if collisions is None else collisions).get(key)
            if other is not None:
                # Kafka (KRaft's ReplicationControlManager) words it so
                raise TopicError(ErrorCode.invalid_topic_exception,
                                 f"Topic '{name}' collides with existing topic: {other}")
        num_partitions, replication_factor = spec.num_partitions, spec.replication_factor
        assignment = spec.assignment
        if num_partitions == -1:
            num_partitions = int(self.config["num.partitions"])
        if replication_factor == -1:
            replication_factor = int(self.config["default.replication.factor"])
        if assignment is None:
            if not 1 <= num_partitions <= MAX_PARTITIONS:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"Number of partitions must be between 1 and {MAX_PARTITIONS}.",
                )
            if replication_factor < 1:
                raise TopicError(
                    ErrorCode.invalid_replication_factor,
                    "Replication factor must be larger than 0.",
                )
            assignment = self._assign(num_partitions, replication_factor)
        else:
            if not 1 <= len(assignment) <= MAX_PARTITIONS:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"Number of partitions must be between 1 and {MAX_PARTITIONS}.",
                )
            live = {b.node_id for b in self.metadata.live_brokers()}
            for replicas in assignment:
                if not replicas or len(set(replicas)) != len(replicas) or set(replicas) - live:
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"Invalid replica assignment {replicas}",
                    )
        overrides = validate_configs(spec.configs)
        check_internal_configs(name, overrides, self.config)
        states = [PartitionState(replicas=list(r), leader=r[0], isr=list(r)) for r in assignment]
        return TopicPlan(name, states, overrides)

    def _assign(self, partitions: int, rf: int, start: int = 0) -> list[list[int]]:
        """Replica assignment (R-REP-1): a single node round-robin; a cluster Kafka's way
        (random start, rack-aware with ``broker.rack``) over the live brokers."""
        brokers = self.metadata.live_brokers()
        if self.cluster is None:
            return assign_replicas([b.node_id for b in brokers], partitions, rf, start)
        from headrace.cluster import controller

        try:
            return controller.assign_replicas([(b.node_id, b.rack) for b in brokers],
                                              partitions, rf, start_partition=start)
        except controller.InvalidReplicationFactor as e:
            raise TopicError(ErrorCode.invalid_replication_factor, str(e)) from None
        except controller.InvalidReplicaAssignment as e:
            raise TopicError(ErrorCode.invalid_replica_assignment, str(e)) from None

    def _hosted(self, states: Iterable[PartitionState]) -> int:
        node = self.replicas.node_id
        return sum(1 for s in states if node in s.replicas)

    def create(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, Any],
        *,
        assignment: list[list[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicState | None:
        """Create one topic on the event loop (auto-creation, ``__consumer_offsets``: small
        topics); CreateTopics uses ``create_topics``. All or nothing, TopicError if not."""
        plan = self.plan(TopicSpec(name, num_partitions, replication_factor, configs,
                                   assignment))
        self.check_partition_limit(self._hosted(plan.states))
        if validate_only:
            return None
        if self.cluster is not None:
            self._create_in_background(plan)
            raise TopicError(ErrorCode.leader_not_available,
                             f"Topic '{name}' is being created.")
        provisional = self._provisional(plan)
        indexes = range(len(plan.states))
        try:
            logs = self._open_fresh(provisional, indexes)
        except Exception as e:  # OSError, or a log that cannot open
            raise _storage_error(f"Creating the partitions of topic '{name}'", e) from None
        return self._commit_create(plan, provisional, logs)

    async def create_topics(
        self, specs: Sequence[TopicSpec | TopicError], validate_only: bool,
        timeout_ms: int = 0,
    ) -> list[Outcome]:
        """CreateTopics: each topic its own result (a TopicState, the TopicPlan when
        ``validate_only``, or a TopicError), each all or nothing. The partition limit is
        checked for the whole request first: if the topics would take this broker past
        ``max.broker.partitions`` together, every one of them is refused and nothing is
        created. Directories and logs are made in a worker thread. On a cluster the answer
        waits for the leaders up to the request's ``timeout_ms`` (Kafka's), or, when that
        is 0 or less, ``request.timeout.ms`` (where Kafka answers at once)."""
        out: list[Outcome] = []
        collisions = self._collisions()
        for spec in specs:
            if isinstance(spec, TopicError):
                out.append(spec)
                continue
            try:
                plan = self.plan(spec, collisions)
            except TopicError as e:
                out.append(e)
                continue
            if any(isinstance(o, TopicPlan) and o.name == plan.name for o in out):
                out.append(TopicError(ErrorCode.invalid_request,
                                      f"Duplicate topic name {plan.name!r} in the request"))
                continue
            key = collision_key(plan.name)
            if key is not None:  # a later topic of the request colliding with this one
                collisions.setdefault(key, plan.name)
            out.append(plan)
        plans = [o for o in out if isinstance(o, TopicPlan)]
        try:
            self.check_partition_limit(sum(self._hosted(p.states) for p in plans))
        except TopicError as e:
            return [e if isinstance(o, TopicPlan) else o for o in out]
        if validate_only or not plans:
            return out
        for p in plans:
            self._reserved[p.name] = self._hosted(p.states)
        started: set[str] = set()
        try:
            if self.cluster is not None:
                # every topic of the request at once, as Kafka's one DelayedCreatePartitions
                # for the request: one after the other, each waiting for its leaders, a
                # request of 10 topics of 1,000 partitions took over librdkafka's 60 s
                # socket timeout (bench/cluster_bench.py --scale)
                at = [i for i, o in enumerate(out) if isinstance(o, TopicPlan)]
                plans_at = [out[i] for i in at]
                started.update(p.name for p in plans)  # each create releases its own
                results = await asyncio.gather(
                    *(_to_completion(self._create_in_cluster(p, timeout_ms)) for p in plans_at
                      if isinstance(p, TopicPlan)), return_exceptions=True)
                for i, r in zip(at, results, strict=True):
                    if isinstance(r, TopicError | TopicState):
                        out[i] = r
                    else:
                        raise r
                return out
            for i, o in enumerate(out):
                if isinstance(o, TopicPlan):
                    started.add(o.name)  # from here its create releases its reservation
                    try:
                        out[i] = await _to_completion(self._create_off_loop(o))
                    except TopicError as e:
                        out[i] = e
        finally:
            for p in plans:
                if p.name not in started:
                    self._reserved.pop(p.name, None)
        return out

    async def _create_off_loop(self, plan: TopicPlan) -> TopicState:
        """Directories and logs in a worker thread, then the commit on the loop. The name
        stays reserved until the commit (even if the request is cancelled meanwhile), so
        no other create can take it or clear its directories."""
        provisional = self._provisional(plan)
        indexes = range(len(plan.states))
        try:
            try:
                logs = await asyncio.to_thread(self._open_fresh, provisional, indexes)
            except Exception as e:  # OSError, or a log that cannot open
                raise _storage_error(
                    f"Creating the partitions of topic '{plan.name}'", e) from None
            if self.metadata.topic(plan.name) is not None:  # not while reserved; defensive
                for plog in logs.values():
                    plog.close()
                raise TopicError(ErrorCode.topic_already_exists,
                                 f"Topic '{plan.name}' already exists.")
            topic = self._commit_create(plan, provisional, logs, install=False)
        finally:
            self._reserved.pop(plan.name, None)  # the metadata holds it now (or nothing)
        await self._install_gradually(topic, logs)
        return topic

    @staticmethod
    def _provisional(plan: TopicPlan) -> TopicState:
        """The topic as ``open_logs`` needs it, before the metadata knows it."""
        return TopicState(plan.name, plan.topic_id, plan.states, plan.overrides)

    def _commit_create(
        self, plan: TopicPlan, provisional: TopicState,
        logs: dict[TopicPartition, PartitionLog], *, install: bool = True,
    ) -> TopicState:
        try:
            topic = self.metadata.create_topic(plan.name, plan.states, plan.overrides,
                                               topic_id=plan.topic_id)
        except (MetadataError, OSError) as e:
            self._discard(logs, provisional, range(len(plan.states)))
            raise _storage_error(f"Saving the metadata of topic '{plan.name}'", e) from None
        if install:
            self.replicas.install(topic, logs)
        log.info("created topic %s partitions=%d replication=%d configs=%s",
                 plan.name, len(plan.states), plan.replication_factor, plan.overrides)
        return topic

    async def _install_gradually(
        self, topic: TopicState, logs: dict[TopicPartition, PartitionLog]
    ) -> None:
        """``install`` in chunks, yielding to the event loop between them (installing
        10,000 partitions at once held the loop for ~170 ms). A partition not yet installed
        answers a retriable error for a moment; a topic deleted meanwhile gets no more."""
        items = list(logs.items())
        for start in range(0, len(items), INSTALL_CHUNK):
            if self.metadata.topic(topic.name) is not topic:  # deleted meanwhile
                for _, plog in items[start:]:
                    try:
                        plog.close()
                    except Exception as e:
                        log.warning("closing %s failed: %s", plog.dir, e)
                return
            self.replicas.install(topic, dict(items[start:start + INSTALL_CHUNK]))
            if start + INSTALL_CHUNK < len(items):
                await asyncio.sleep(0)

    def _open_fresh(
        self, topic: TopicState, indexes: range
    ) -> dict[TopicPartition, PartitionLog]:
        """Filesystem only (worker-thread safe): remove directories of ``topic`` left by a
        failed create or an interrupted delete, then create and open the logs; on a
        failure, remove what was made."""
        stale = self._remove_dirs(topic, indexes)
        if stale:
            log.warning("removed %d leftover partition director%s of topic %s before "
                        "creating it", stale, "y" if stale == 1 else "ies", topic.name)
        try:
            return self.replicas.open_logs(topic, indexes)
        except BaseException:
            self._remove_dirs(topic, indexes)
            raise

    def _discard(
        self, logs: dict[TopicPartition, PartitionLog], topic: TopicState, indexes: range
    ) -> None:
        for plog in logs.values():
            try:
                plog.close()
            except Exception as e:  # the directory goes next anyway
                log.warning("closing %s failed: %s", plog.dir, e)
        self._remove_dirs(topic, indexes)

    def _remove_dirs(self, topic: TopicState, indexes: range) -> int:
        """Remove the directories of ``topic``'s partitions ``indexes``; returns how many
        existed. The data dir is listed once (not one failed lookup per partition: each
        system call in the worker thread waits for the GIL again while the loop is busy).
        Errors are logged once, not raised: what stays is removed by the next create of
        the name (and by the replica manager's stray sweep at start)."""
        try:
            present = set(os.listdir(self.replicas.data_dir))
        except OSError as e:
            log.error("cannot list data dir %s: %s", self.replicas.data_dir, e)
            return 0
        data_dir = self.replicas.data_dir
        names = [n for n in (partition_dir(data_dir, TopicPartition(topic.name, i)).name
                             for i in indexes) if n in present]
        removed = 0
        failed: list[str] = []
        for name in names:
            try:
                shutil.rmtree(data_dir / name)
            except FileNotFoundError:
                continue
            except OSError as e:
                failed.append(f"{name}: {e}")
                continue
            removed += 1
        if failed:
            log.error("could not remove %d partition director%s of topic %s (first: %s)",
                      len(failed), "y" if len(failed) == 1 else "ies", topic.name, failed[0])
        return removed

    def auto_create(self, name: str) -> TopicState:
        topic = self.create(name, -1, -1, {})
        assert topic is not None
        return topic

    # ------------------------------------------------------------------ delete
    def delete(self, name: str) -> None:
        if self.metadata.topic(name) is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition,
                "This server does not host this topic-partition.",
            )
        if not self.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        if name in self._busy:
            raise TopicError(ErrorCode.invalid_request,
                             f"Partitions are being added to topic '{name}'; retry.")
        self.metadata.delete_topic(name)
        self.replicas.delete_topic(name)
        log.info("deleted topic %s", name)

    # ------------------------------------------------------------------ partitions
    def plan_partitions(
        self, name: str, count: int, assignment: list[list[int]] | None
    ) -> list[PartitionState]:
        """Validate a CreatePartitions entry; returns the new partitions' states."""
        topic = self.metadata.topic(name)
        if topic is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition,
                "This server does not host this topic-partition.",
            )
        if name in KAFKA_INTERNAL_TOPICS:
            # Kafka's brokers accept this; headrace refuses it (README, "Durability and
            # hostile clients"): a group's (a transactional id's) coordinator is the
            # partition its id hashes to, modulo the partition count
            raise TopicError(
                ErrorCode.invalid_request,
                f"The number of partitions of internal topic {name} cannot be changed: "
                "every consumer group and transactional id is placed by it, so a change "
                "would move their coordinators away from their committed state")
        if name in self._busy:
            raise TopicError(ErrorCode.invalid_request,
                             f"Partitions are already being added to topic '{name}'.")
        current = len(topic.partitions)
        if count <= current:
            raise TopicError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, {count} would not be an increase.",
            )
        if count > MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions, "Too many partitions.")
        rf = len(topic.partitions[0].replicas)
        brokers = [b.node_id for b in self.metadata.live_brokers()]
        if assignment is None:
            new = self._assign(count - current, rf, start=current)
        else:
            if len(assignment) != count - current:
                raise TopicError(
                    ErrorCode.invalid_replica_assignment,
                    f"Increasing the number of partitions by {count - current} but "
                    f"{len(assignment)} assignments provided.",
                )
            new = assignment
            for replicas in new:
                if (len(replicas) != rf or len(set(replicas)) != len(replicas)
                        or set(replicas) - set(brokers)):
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"Invalid replica assignment {replicas}",
                    )
        return [PartitionState(replicas=list(r), leader=r[0], isr=list(r)) for r in new]

    def add_partitions(
        self,
        name: str,
        count: int,
        assignment: list[list[int]] | None,
        validate_only: bool,
    ) -> None:
        """CreatePartitions for one topic on the event loop (all or nothing)."""
        new = self.plan_partitions(name, count, assignment)
        self.check_partition_limit(self._hosted(new))
        if validate_only:
            return
        topic, provisional, indexes = self._provisional_growth(name, new)
        try:
            logs = self._open_fresh(provisional, indexes)
        except Exception as e:  # OSError, or a log that cannot open
            raise _storage_error(f"Creating partitions of topic '{name}'", e) from None
        self._commit_partitions(topic, new, provisional, indexes, logs)

    async def create_partitions(
        self, requests: Sequence[tuple[str, int, list[list[int]] | None] | TopicError],
        validate_only: bool,
    ) -> list[TopicError | None]:
        """CreatePartitions: each topic its own result (None: done), each all or nothing;
        the partition limit checked for the whole request first (every topic refused when
        together they exceed it). Directories and logs are made in a worker thread; requests
        run one after another, as Kafka's controller applies them."""
        if self._growing is None:
            self._growing = asyncio.Lock()
        async with self._growing:
            return await self._create_partitions(requests, validate_only)

    async def _create_partitions(
        self, requests: Sequence[tuple[str, int, list[list[int]] | None] | TopicError],
        validate_only: bool,
    ) -> list[TopicError | None]:
        out: list[TopicError | list[PartitionState] | None] = []
        for r in requests:
            if isinstance(r, TopicError):
                out.append(r)
                continue
            name, count, assignment = r
            try:
                out.append(self.plan_partitions(name, count, assignment))
            except TopicError as e:
                out.append(e)
        planned = [o for o in out if isinstance(o, list)]
        try:
            self.check_partition_limit(sum(self._hosted(p) for p in planned))
        except TopicError as e:
            return [e if isinstance(o, list) else o for o in out]
        results: list[TopicError | None] = []
        for r, o in zip(requests, out, strict=True):
            if not isinstance(o, list):
                results.append(o)
                continue
            if validate_only:
                results.append(None)
                continue
            assert not isinstance(r, TopicError)
            try:
                if self.cluster is not None:
                    await _to_completion(self._grow_in_cluster(r[0], o))
                else:
                    await _to_completion(self._grow_off_loop(r[0], o))
            except TopicError as e:
                results.append(e)
            else:
                results.append(None)
        return results

    async def _grow_off_loop(self, name: str, new: list[PartitionState]) -> None:
        topic, provisional, indexes = self._provisional_growth(name, new)
        self._busy.add(name)
        try:
            try:
                logs = await asyncio.to_thread(self._open_fresh, provisional, indexes)
            except Exception as e:  # OSError, or a log that cannot open
                raise _storage_error(f"Creating partitions of topic '{name}'", e) from None
        finally:
            self._busy.discard(name)
        self._commit_partitions(topic, new, provisional, indexes, logs, install=False)
        await self._install_gradually(topic, logs)

    def _provisional_growth(
        self, name: str, new: list[PartitionState]
    ) -> tuple[TopicState, TopicState, range]:
        topic = self.metadata.topic(name)
        assert topic is not None
        provisional = TopicState(name, topic.topic_id, [*topic.partitions, *new],
                                 dict(topic.configs))
        return topic, provisional, range(len(topic.partitions), len(provisional.partitions))

    def _commit_partitions(
        self, topic: TopicState, new: list[PartitionState], provisional: TopicState,
        indexes: range, logs: dict[TopicPartition, PartitionLog], *, install: bool = True,
    ) -> None:
        if self.metadata.topic(topic.name) is not topic or len(topic.partitions) != indexes.start:
            self._discard(logs, provisional, indexes)
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"Topic '{topic.name}' changed while partitions were added.")
        try:
            self.metadata.add_partitions(topic.name, new)
        except (MetadataError, OSError) as e:
            self._discard(logs, provisional, indexes)
            raise _storage_error(f"Saving the metadata of topic '{topic.name}'", e) from None
        if install:
            self.replicas.install(topic, logs)
        log.info("topic %s now has %d partitions", topic.name, len(topic.partitions))


    # ------------------------------------------------------------------ on a cluster
    def _timeout_s(self) -> float:
        return int(self.config["request.timeout.ms"]) / 1000

    async def _create_in_cluster(self, plan: TopicPlan, timeout_ms: int = 0) -> TopicState:
        """Write the topic's znodes (configs, then the assignment); the controller elects
        its leaders and every replica opens its log. Answered once this broker's cache
        shows a leader for every partition (Kafka's DelayedCreatePartitions), or
        REQUEST_TIMED_OUT after ``request.timeout.ms`` (the topic exists then)."""
        from headrace.cluster.zk_store import TopicExistsError

        store: Any = self.metadata
        try:
            try:
                await asyncio.to_thread(
                    store.create_topic_znodes, plan.name, [list(s.replicas) for s in plan.states],
                    plan.overrides, plan.topic_id)
            except TopicExistsError:
                raise TopicError(ErrorCode.topic_already_exists,
                                 f"Topic '{plan.name}' already exists.") from None
            except Exception as e:
                raise TopicError(ErrorCode.unknown_server_error,
                                 f"Saving topic '{plan.name}' in ZooKeeper failed: {e}") from None
        finally:
            self._reserved.pop(plan.name, None)
        log.info("created topic %s partitions=%d replication=%d configs=%s",
                 plan.name, len(plan.states), plan.replication_factor, plan.overrides)

        def ready() -> bool:
            t = self.metadata.topic(plan.name)
            return t is not None and all(p.leader >= 0 for p in t.partitions)

        wait_s = timeout_ms / 1000 if timeout_ms > 0 else self._timeout_s()
        if not await self.cluster.wait_for(ready, wait_s):
            raise TopicError(ErrorCode.request_timed_out,
                             f"Topic '{plan.name}' was created but not every partition has a "
                             "leader yet.")
        topic = self.metadata.topic(plan.name)
        assert topic is not None
        return topic

    def _create_in_background(self, plan: TopicPlan) -> None:
        """Auto-creation on a cluster: the znodes are written off the event loop; the
        client is answered LEADER_NOT_AVAILABLE meanwhile and retries, as with Kafka."""
        if plan.name in self._auto_creating:
            return
        self._auto_creating.add(plan.name)

        async def create() -> None:
            try:
                await self._create_in_cluster(plan)
            except TopicError as e:
                if e.error_code not in (ErrorCode.topic_already_exists,
                                        ErrorCode.request_timed_out):
                    log.warning("auto-creating topic %s failed: %s", plan.name, e.message)
            finally:
                self._auto_creating.discard(plan.name)

        self.cluster.broker.track(asyncio.get_running_loop().create_task(create()))

    async def delete_async(self, name: str) -> None:
        """DeleteTopics: on a cluster, ask the controller (``/admin/delete_topics``) and
        wait until the topic is gone from this broker's metadata (bounded)."""
        if self.cluster is None:
            self.delete(name)
            return
        if self.metadata.topic(name) is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             "This server does not host this topic-partition.")
        if not self.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        store: Any = self.metadata
        try:
            await asyncio.to_thread(store.request_topic_deletion, name)
        except Exception as e:
            raise TopicError(ErrorCode.unknown_server_error,
                             f"Requesting the deletion of '{name}' failed: {e}") from None
        if not await self.cluster.wait_for(lambda: self.metadata.topic(name) is None,
                                           self._timeout_s()):
            raise TopicError(ErrorCode.request_timed_out,
                             f"Topic '{name}' is marked for deletion; not gone yet.")
        log.info("deleted topic %s", name)

    async def _grow_in_cluster(self, name: str, new: list[PartitionState]) -> None:
        topic = self.metadata.topic(name)
        assert topic is not None
        full = [list(p.replicas) for p in topic.partitions] + [list(p.replicas) for p in new]
        store: Any = self.metadata
        from headrace.cluster.zk_store import ReassignmentInProgressError

        try:
            await asyncio.to_thread(store.add_partition_znodes, name, full)
        except ReassignmentInProgressError as e:
            raise TopicError(ErrorCode.reassignment_in_progress, str(e)) from None
        except Exception as e:
            raise TopicError(ErrorCode.unknown_server_error,
                             f"Saving the partitions of '{name}' failed: {e}") from None

        def ready() -> bool:
            t = self.metadata.topic(name)
            return (t is not None and len(t.partitions) >= len(full)
                    and all(p.leader >= 0 for p in t.partitions))

        if not await self.cluster.wait_for(ready, self._timeout_s()):
            raise TopicError(ErrorCode.request_timed_out,
                             f"Partitions of '{name}' were added but lack leaders yet.")
        log.info("topic %s now has %d partitions", name, len(full))

    async def set_configs_async(self, name: str, overrides: Mapping[str, str]) -> None:
        if self.cluster is None:
            self.set_configs(name, overrides)
            return
        store: Any = self.metadata
        await asyncio.to_thread(store.set_topic_config_znode, name, dict(overrides))
        want = dict(overrides)
        await self.cluster.wait_for(
            lambda: (t := self.metadata.topic(name)) is None or dict(t.configs) == want,
            self._timeout_s())
        log.info("topic %s configs now %s", name, want)

    # ------------------------------------------------------------------ configs
    def set_configs(self, name: str, overrides: Mapping[str, str]) -> None:
        topic = self.metadata.topic(name)
        assert topic is not None
        self.metadata.set_topic_configs(name, overrides)
        self.replicas.update_topic_config(topic)
        log.info("topic %s configs now %s", name, dict(overrides))
