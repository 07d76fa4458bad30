"""Share sessions (KIP-932): Kafka's ShareSessionCache and SharePartitionManager.newContext /
acknowledgeSessionUpdate rules, one test per rule (headrace.share.session)."""

from __future__ import annotations

import base64
import uuid

import pytest
from kio.schema.errors import ErrorCode

from headrace.share.session import (
    MAX_EPOCH,
    ShareSessionCache,
    ShareSessionError,
    next_epoch,
    parse_member_id,
)

T = uuid.uuid4()
P0, P1, P2 = (T, 0), (T, 1), (T, 2)


def code(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(ShareSessionError) as e:
        fn(*args)
    return e.value.code


def test_epoch_zero_opens_a_session_with_the_requests_partitions() -> None:
    c = ShareSessionCache()
    ctx = c.new_context("g", "m", 0, [P0, P1], [], False, "conn-1")
    assert ctx.partitions == (P0, P1) and not ctx.subsequent and not ctx.final
    assert ctx.session.epoch == 1


def test_acknowledgements_in_an_opening_request_are_invalid() -> None:
    c = ShareSessionCache()
    assert code(c.new_context, "g", "m", 0, [P0], [], True, "c") == ErrorCode.invalid_request
    assert len(c) == 0


def test_opening_again_replaces_the_members_session() -> None:
    c = ShareSessionCache()
    c.new_context("g", "m", 0, [P0], [], False, "c")
    ctx = c.new_context("g", "m", 0, [P1], [], False, "c")
    assert ctx.partitions == (P1,) and len(c) == 1


def test_the_cache_is_bounded() -> None:
    c = ShareSessionCache(max_sessions=2)
    c.new_context("g", "a", 0, [P0], [], False, "c1")
    c.new_context("g", "b", 0, [P0], [], False, "c2")
    assert code(c.new_context, "g", "c", 0, [P0], [], False, "c3") == \
        ErrorCode.share_session_limit_reached
    c.new_context("g", "a", 0, [P1], [], False, "c1")  # replacing one's own still works


def test_a_subsequent_request_needs_the_session_and_its_epoch() -> None:
    c = ShareSessionCache()
    assert code(c.new_context, "g", "m", 1, [], [], False, "c") == \
        ErrorCode.share_session_not_found
    c.new_context("g", "m", 0, [P0], [], False, "c")
    assert code(c.new_context, "g", "m", 2, [], [], False, "c") == \
        ErrorCode.invalid_share_session_epoch
    ctx = c.new_context("g", "m", 1, [P1, P2], [P0], False, "c")
    assert ctx.subsequent and ctx.partitions == (P1, P2) and ctx.session.epoch == 2


def test_the_final_epoch_needs_a_session_and_fetches_nothing() -> None:
    c = ShareSessionCache()
    assert code(c.new_context, "g", "m", -1, [], [], True, "c") == \
        ErrorCode.share_session_not_found
    c.new_context("g", "m", 0, [P0], [], False, "c")
    ctx = c.new_context("g", "m", -1, [P1], [], True, "c")
    assert ctx.final and ctx.partitions == ()


def test_share_acknowledge_never_opens_and_keeps_the_epoch_in_step() -> None:
    c = ShareSessionCache()
    assert code(c.acknowledge_update, "g", "m", 0) == ErrorCode.invalid_share_session_epoch
    assert code(c.acknowledge_update, "g", "m", 1) == ErrorCode.share_session_not_found
    c.new_context("g", "m", 0, [P0], [], False, "c")
    assert code(c.acknowledge_update, "g", "m", 3) == ErrorCode.invalid_share_session_epoch
    assert c.acknowledge_update("g", "m", 1).epoch == 2
    assert c.acknowledge_update("g", "m", -1).epoch == 2  # final: left to be released
    assert c.new_context("g", "m", 2, [], [], False, "c").session.epoch == 3


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(MAX_EPOCH) == 1 and next_epoch(1) == 2


def test_only_changes_are_answered_in_a_subsequent_response() -> None:
    """CachedSharePartition.maybeUpdateResponseData: records or an error always; a quiet
    partition once after it joined or after an error cleared."""
    c = ShareSessionCache()
    s = c.new_context("g", "m", 0, [P0], [], False, "c").session
    assert not s.must_respond(P0, False, False)  # sent in the opening response
    s = c.new_context("g", "m", 1, [P1], [], False, "c").session
    assert s.must_respond(P1, False, False) and not s.must_respond(P1, False, False)
    assert s.must_respond(P0, True, False)
    assert s.must_respond(P0, False, True)
    assert s.must_respond(P0, False, False)  # the error cleared: said once
    assert not s.must_respond(P0, False, False)


def test_a_closed_connection_takes_its_session() -> None:
    c = ShareSessionCache()
    c.new_context("g", "m", 0, [P0], [], False, "c1")
    c.new_context("g", "n", 0, [P0], [], False, "c2")
    gone = c.connection_closed("c1")
    assert gone is not None and gone.key == ("g", "m")
    assert c.get("g", "m") is None and c.get("g", "n") is not None
    assert c.connection_closed("c1") is None


def test_member_ids_are_kafka_uuids() -> None:
    good = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    assert parse_member_id(good) == good
    for bad in ("", None, "x" * 22 + "=", "not-a-uuid", good + "A"):
        assert code(parse_member_id, bad) == ErrorCode.invalid_request
