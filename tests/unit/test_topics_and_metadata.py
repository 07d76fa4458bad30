"""Topic rules (names, replica assignment), the local metadata store (R-REP-1, R-REP-9) and
TopicAdmin's all-or-nothing creates and partition limit (issue 8 items 2 and 9, R-NF-1)."""

import asyncio
import errno
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from headrace.broker.replica_manager import ReplicaManager, TopicPartition
from headrace.broker.server import make_config
from headrace.broker.topics import (
    TopicAdmin,
    TopicError,
    TopicSpec,
    assign_replicas,
    validate_configs,
    validate_topic_name,
)
from headrace.clock import ManualClock
from headrace.metadata.store import (
    BrokerInfo,
    LocalMetadataStore,
    MetadataError,
    MetadataWriteError,
    PartitionState,
    TopicState,
)


@pytest.mark.parametrize("name", ["", ".", "..", "bad name", "x" * 250, "a/b", "ü"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_name(name)
    assert info.value.error_code == ErrorCode.invalid_topic_exception


def test_legal_topic_names() -> None:
    for name in ["a", "A.b_c-9", "x" * 249, "__consumer_offsets"]:
        assert validate_topic_name(name) == name


def test_replica_assignment_spreads_leaders() -> None:
    a = assign_replicas([0, 1, 2], 6, 2)
    assert [r[0] for r in a] == [0, 1, 2, 0, 1, 2]
    assert all(len(set(r)) == 2 for r in a)
    with pytest.raises(TopicError) as info:
        assign_replicas([0], 1, 3)
    assert info.value.error_code == ErrorCode.invalid_replication_factor


def test_configs_are_canonicalised_or_invalid_config() -> None:
    assert validate_configs({"retention.ms": " 100 "}) == {"retention.ms": "100"}
    with pytest.raises(TopicError) as info:
        validate_configs({"retention.ms": "x"})
    assert info.value.error_code == ErrorCode.invalid_config


def test_metadata_store_persists_and_reloads(tmp_path) -> None:
    me = BrokerInfo(0, "127.0.0.1", 9092)
    store = LocalMetadataStore(tmp_path, me)
    t = store.create_topic("t", [PartitionState([0], 0, 0, [0])], {"retention.ms": "5"})
    first_pid = store.allocate_producer_ids(10)
    again = LocalMetadataStore(tmp_path, me)
    assert again.cluster_id == store.cluster_id
    loaded = again.topic("t")
    assert loaded is not None and loaded.topic_id == t.topic_id
    assert again.topic_by_id(t.topic_id) is loaded
    assert loaded.configs == {"retention.ms": "5"}
    assert again.allocate_producer_ids(1) == first_pid + 10  # ids are never reused
    again.delete_topic("t")
    assert LocalMetadataStore(tmp_path, me).topic("t") is None
    assert isinstance(t.topic_id, uuid.UUID)


def test_unreadable_metadata_is_a_clear_error(tmp_path) -> None:
    (tmp_path / LocalMetadataStore.FILE_NAME).write_text("{not json")
    with pytest.raises(MetadataError, match="cannot read cluster metadata"):
        LocalMetadataStore(tmp_path, BrokerInfo(0, "h", 1))
    (tmp_path / LocalMetadataStore.FILE_NAME).write_text(json.dumps({"topics": {}}))
    with pytest.raises(MetadataError):
        LocalMetadataStore(tmp_path, BrokerInfo(0, "h", 1))


# ---------------------------------------------------------------- TopicAdmin: all or nothing

def make_admin(tmp_path: Path, **config: str) -> TopicAdmin:
    cfg = make_config(tmp_path, **config)
    store = LocalMetadataStore(tmp_path, BrokerInfo(cfg.node_id, "127.0.0.1", 9092))
    return TopicAdmin(cfg, store, ReplicaManager(tmp_path, cfg, store, ManualClock()))


def partition_dirs(tmp_path: Path) -> list[str]:
    return sorted(d.name for d in tmp_path.iterdir() if d.is_dir())


def nothing_of(admin: TopicAdmin, tmp_path: Path, name: str) -> None:
    assert admin.metadata.topic(name) is None
    assert not [tp for tp in admin.replicas.partitions if tp.topic == name]
    assert not [d for d in partition_dirs(tmp_path) if d.startswith(name + "-")]
    reopened = LocalMetadataStore(tmp_path, BrokerInfo(0, "h", 1))
    assert reopened.topic(name) is None


def enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_failed_metadata_save_leaves_no_half_created_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 8 item 2: a metadata save failing (ENOSPC) leaves nothing: not in memory, not
    in the store, no directories; the error is KAFKA_STORAGE_ERROR, and the same create
    works once the disk has room (R-LOG-4)."""
    admin = make_admin(tmp_path)
    store = admin.metadata
    assert isinstance(store, LocalMetadataStore)

    def full(tx: object) -> None:
        raise MetadataWriteError("cannot write cluster metadata: database or disk is full")

    monkeypatch.setattr(store, "_write", full)
    with pytest.raises(TopicError) as info:
        admin.create("t", 3, 1, {})
    assert info.value.error_code == ErrorCode.kafka_storage_error
    assert "disk is full" in info.value.message
    nothing_of(admin, tmp_path, "t")
    monkeypatch.undo()
    topic = admin.create("t", 3, 1, {})
    assert topic is not None and admin.metadata.topic("t") is topic
    assert sorted(tp.partition for tp in admin.replicas.partitions) == [0, 1, 2]
    assert partition_dirs(tmp_path) == ["t-0", "t-1", "t-2"]


def test_failed_directory_creation_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC on the third partition directory: the two made are removed, the metadata
    never hears of the topic (issue 8 item 2)."""
    admin = make_admin(tmp_path)
    real_mkdir = os.mkdir
    made: list[str] = []

    def mkdir(path: object, *args: object, **kwargs: object) -> None:
        if len(made) == 2:
            enospc()
        made.append(str(path))
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(TopicError) as info:
        admin.create("t", 5, 1, {})
    assert info.value.error_code == ErrorCode.kafka_storage_error
    assert len(made) == 2
    nothing_of(admin, tmp_path, "t")


def test_create_topics_off_the_loop_each_topic_all_or_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CreateTopics with three topics where the second one's metadata save fails: the first
    and third exist whole, the second not at all (issue 8 items 2 and 9)."""
    admin = make_admin(tmp_path)
    store = admin.metadata
    assert isinstance(store, LocalMetadataStore)
    real_write = store._write
    calls = []

    def write(tx: object) -> None:
        calls.append(tx)
        if len(calls) == 2:  # the second topic's commit
            raise MetadataWriteError("disk is full")
        real_write(tx)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_write", write)
    specs = [TopicSpec("a", 2, 1), TopicSpec("b", 4, 1), TopicSpec("c", 1, 1)]
    out = asyncio.run(admin.create_topics(specs, validate_only=False))
    assert [type(o).__name__ for o in out] == ["TopicState", "TopicError", "TopicState"]
    assert out[1].error_code == ErrorCode.kafka_storage_error  # type: ignore[union-attr]
    monkeypatch.undo()
    nothing_of(admin, tmp_path, "b")
    assert admin.replicas.get(TopicPartition("a", 1)) is not None
    out = asyncio.run(admin.create_topics([TopicSpec("b", 4, 1)], validate_only=False))
    assert isinstance(out[0], TopicState)
    assert partition_dirs(tmp_path) == ["a-0", "a-1", "b-0", "b-1", "b-2", "b-3", "c-0"]


def test_leftover_directories_are_not_adopted(tmp_path: Path) -> None:
    """A directory of a topic the metadata does not know (a crash before the metadata
    commit, or mid-delete) is removed before a create of that name: a new topic never
    adopts old files (issue 8 items 2 and 4)."""
    admin = make_admin(tmp_path)
    old = tmp_path / "t-0"
    old.mkdir()
    (old / "00000000000000000000.log").write_bytes(b"x" * 100)
    admin.create("t", 1, 1, {})
    p = admin.replicas.get(TopicPartition("t", 0))
    assert p is not None and p.log.log_end_offset == 0
    assert not (tmp_path / "t-0" / "00000000000000000000.log").read_bytes().startswith(b"x")


def test_partition_limit_refuses_the_whole_request_up_front(tmp_path: Path) -> None:
    """max.broker.partitions (issue 8 item 9): topics that would together take the broker
    past it are all refused with POLICY_VIOLATION before anything is created, validate_only
    too; single topics and CreatePartitions too; topics within the limit still work."""
    admin = make_admin(tmp_path, **{"max.broker.partitions": "10"})
    admin.create("base", 4, 1, {})
    specs = [TopicSpec("x", 3, 1), TopicSpec("y", 4, 1)]
    for validate_only in (True, False):
        out = asyncio.run(admin.create_topics(specs, validate_only=validate_only))
        assert all(isinstance(o, TopicError) and o.error_code == ErrorCode.policy_violation
                   for o in out)
        assert "max.broker.partitions=10" in out[0].message  # type: ignore[union-attr]
    assert set(admin.metadata.topics()) == {"base"}
    assert partition_dirs(tmp_path) == [f"base-{i}" for i in range(4)]
    admin.auto_create("auto")  # num.partitions (1) fits: 5 partitions now
    with pytest.raises(TopicError) as info:
        admin.create("z", 6, 1, {})
    assert info.value.error_code == ErrorCode.policy_violation
    for validate_only in (True, False):
        out2 = asyncio.run(admin.create_partitions([("base", 20, None)],
                                                   validate_only=validate_only))
        assert out2[0] is not None and out2[0].error_code == ErrorCode.policy_violation
    assert len(admin.metadata.topic("base").partitions) == 4  # type: ignore[union-attr]
    out2 = asyncio.run(admin.create_partitions([("base", 9, None)], validate_only=False))
    assert out2 == [None]
    assert len(admin.metadata.topic("base").partitions) == 9  # type: ignore[union-attr]
    assert admin.hosted_partitions() == 10


def test_failed_create_partitions_leaves_the_topic_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CreatePartitions whose metadata save fails: no new partition in memory, store or
    on disk; the existing partitions keep serving (issue 8 item 2)."""
    admin = make_admin(tmp_path)
    admin.create("t", 2, 1, {})
    store = admin.metadata
    assert isinstance(store, LocalMetadataStore)

    def full(tx: object) -> None:
        raise MetadataWriteError("disk is full")

    monkeypatch.setattr(store, "_write", full)
    out = asyncio.run(admin.create_partitions([("t", 6, None)], validate_only=False))
    assert out[0] is not None and out[0].error_code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert len(store.topic("t").partitions) == 2  # type: ignore[union-attr]
    assert partition_dirs(tmp_path) == ["t-0", "t-1"]
    assert sorted(tp.partition for tp in admin.replicas.partitions) == [0, 1]
    assert asyncio.run(admin.create_partitions([("t", 6, None)], validate_only=False)) == [None]
    assert partition_dirs(tmp_path) == [f"t-{i}" for i in range(6)]


def test_create_handlers_answer_null_arrays(tmp_path: Path) -> None:
    """Null arrays (the request's topics, a topic's configs or assignments, an assignment's
    broker ids) raised TypeError in the CreateTopics and CreatePartitions handlers (issue 8
    item 11): each is now answered, INVALID_REQUEST for the topic it concerns, and nothing
    of such a topic is created (R-NF-1). The decoder may refuse some of these before the
    handler; the handler must not depend on it."""
    from types import SimpleNamespace as NS

    from headrace.broker.handlers.base import RequestContext
    from headrace.broker.handlers.create_partitions import handle_create_partitions
    from headrace.broker.handlers.create_topics import handle_create_topics
    from headrace.protocol.codec import RequestHeaderInfo

    admin = make_admin(tmp_path)
    admin.create("grow", 1, 1, {})
    from headrace.broker.security import Security

    broker: Any = NS(topics=admin, config=admin.config, metadata=admin.metadata)
    broker.security = Security(broker)  # no authorizer configured: every check passes

    def ctx(api_key: int, version: int) -> RequestContext:
        return RequestContext(RequestHeaderInfo(api_key, version, 1, "t"), "peer")

    def topic(name: str, **kw: Any) -> NS:
        return NS(**{"name": name, "num_partitions": 1, "replication_factor": 1,
                     "assignments": [], "configs": [], **kw})

    resp = asyncio.run(handle_create_topics(broker, ctx(19, 5), NS(
        topics=None, validate_only=False, timeout=1000)))
    assert list(resp.topics) == []
    resp = asyncio.run(handle_create_topics(broker, ctx(19, 5), NS(topics=[
        topic("n-configs", configs=None),
        topic("n-assign", assignments=None),
        topic("n-brokers", num_partitions=-1, replication_factor=-1,
              assignments=[NS(partition_index=0, broker_ids=None)]),
        topic("fine"),
    ], validate_only=False, timeout=1000)))
    codes = {t.name: t.error_code for t in resp.topics}
    assert codes == {"n-configs": ErrorCode.invalid_request,
                     "n-assign": ErrorCode.invalid_request,
                     "n-brokers": ErrorCode.invalid_request, "fine": ErrorCode.none}
    assert set(admin.metadata.topics()) == {"grow", "fine"}

    resp = asyncio.run(handle_create_partitions(broker, ctx(37, 3), NS(
        topics=None, validate_only=False, timeout_ms=1000)))
    assert list(resp.results) == []
    resp = asyncio.run(handle_create_partitions(broker, ctx(37, 3), NS(topics=[
        NS(name="grow", count=3, assignments=[NS(broker_ids=None), NS(broker_ids=None)]),
    ], validate_only=False, timeout_ms=1000)))
    assert resp.results[0].error_code == ErrorCode.invalid_request
    resp = asyncio.run(handle_create_partitions(broker, ctx(37, 3), NS(topics=[
        NS(name="grow", count=3, assignments=None),  # nullable: the broker assigns
    ], validate_only=False, timeout_ms=1000)))
    assert resp.results[0].error_code == ErrorCode.none
    assert len(admin.metadata.topic("grow").partitions) == 3  # type: ignore[union-attr]


def test_a_cancelled_create_request_does_not_cut_the_create_in_half(tmp_path: Path) -> None:
    """The request of a CreateTopics is cancelled (its client gone, the broker stopping)
    while the directories are made in the worker thread: the create still completes whole
    (all partitions in metadata, installed, on disk), never half, and no other create can
    take the name meanwhile (issue 8 item 2)."""
    admin = make_admin(tmp_path)

    async def main() -> None:
        request = asyncio.ensure_future(
            admin.create_topics([TopicSpec("c", 300, 1)], validate_only=False))
        deadline = asyncio.get_running_loop().time() + 10
        while "c" not in admin._reserved:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert admin.metadata.topic("c") is None  # still in the worker thread
        with pytest.raises(TopicError) as info:  # and the name stays taken meanwhile
            admin.create("c", 1, 1, {})
        assert info.value.error_code == ErrorCode.topic_already_exists
        while admin.metadata.topic("c") is None:
            assert asyncio.get_running_loop().time() < deadline, "the create never finished"
            await asyncio.sleep(0.01)

    asyncio.run(main())
    topic = admin.metadata.topic("c")
    assert topic is not None and len(topic.partitions) == 300
    assert len([tp for tp in admin.replicas.partitions if tp.topic == "c"]) == 300
    assert len(partition_dirs(tmp_path)) == 300


def test_a_log_that_cannot_open_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The third partition's log fails to open (not an OSError): KAFKA_STORAGE_ERROR, the
    logs opened so far closed and their directories removed, no metadata (issue 8 item 2;
    a traceback in the log is a bug)."""
    from headrace.log.partition_log import PartitionLog

    admin = make_admin(tmp_path)
    real_open = PartitionLog.open
    opened: list[Any] = []

    def open_(*args: Any, **kwargs: Any) -> Any:
        if len(opened) == 2:
            raise ValueError("unexpected file in the new log")
        opened.append(real_open(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(PartitionLog, "open", staticmethod(open_))
    out = asyncio.run(admin.create_topics([TopicSpec("t", 4, 1)], validate_only=False))
    assert isinstance(out[0], TopicError)
    assert out[0].error_code == ErrorCode.kafka_storage_error
    assert "unexpected file" in out[0].message
    nothing_of(admin, tmp_path, "t")


def test_concurrent_creates_of_one_name_and_concurrent_growth(tmp_path: Path) -> None:
    """Two CreateTopics of the same name at once (the first one's directories still being
    made in the worker thread): one creates it, the other answers TOPIC_ALREADY_EXISTS and
    touches nothing. Two CreatePartitions of one topic at once are applied one after the
    other, as Kafka's controller does (issue 8 items 2 and 10)."""
    admin = make_admin(tmp_path)

    async def creates() -> list[Any]:
        return list(await asyncio.gather(
            admin.create_topics([TopicSpec("a", 400, 1)], validate_only=False),
            admin.create_topics([TopicSpec("a", 400, 1)], validate_only=False)))

    first, second = asyncio.run(creates())
    assert isinstance(first[0], TopicState)
    assert isinstance(second[0], TopicError)
    assert second[0].error_code == ErrorCode.topic_already_exists
    assert len(partition_dirs(tmp_path)) == 400
    assert len(admin.replicas.partitions) == 400

    async def grows() -> list[Any]:
        return list(await asyncio.gather(
            admin.create_partitions([("a", 500, None)], validate_only=False),
            admin.create_partitions([("a", 600, None)], validate_only=False)))

    assert asyncio.run(grows()) == [[None], [None]]
    assert len(admin.metadata.topic("a").partitions) == 600  # type: ignore[union-attr]
    assert len(partition_dirs(tmp_path)) == 600
    assert len(admin.replicas.partitions) == 600


def test_embedded_broker_stop_after_a_failed_start_is_quiet(tmp_path: Path) -> None:
    """A failed start (here: the data dir is locked by another broker) raises its clear
    error, and the stop that cleanup code calls afterwards neither raises nor hangs."""
    from headrace.broker.embedded import EmbeddedBroker
    from headrace.broker.server import StartupError

    with EmbeddedBroker(tmp_path / "d"):
        second = EmbeddedBroker(tmp_path / "d")
        with pytest.raises(StartupError, match="in use"):
            second.start()
        second.stop(timeout_s=5)
        assert second._thread is None
