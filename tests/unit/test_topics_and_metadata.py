"""Topic rules (names, replica assignment) and the local metadata store (R-REP-1, R-REP-9)."""

import json
import uuid

import pytest
from kio.schema.errors import ErrorCode

from headrace.broker.topics import (
    TopicError,
    assign_replicas,
    validate_configs,
    validate_topic_name,
)
from headrace.metadata.store import BrokerInfo, LocalMetadataStore, MetadataError, PartitionState


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
