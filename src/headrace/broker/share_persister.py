"""The seams between the share-group shells (KIP-932, issue 25).

Three shells meet here, each behind one small interface so that none reaches into another:

- the **share coordinator** (``share_coordinator.py``): owns ``__share_group_state`` and
  answers InitializeShareGroupState (83) ... ReadShareGroupStateSummary (87). Callers reach
  it through ``SharePersister`` (Kafka's ``Persister`` / ``DefaultStatePersister``): in
  process when this broker coordinates the state's key, over the inter-broker connection
  otherwise;
- the **share-partition manager** (``share_partitions.py``, on each partition leader): the
  ``SharePartition``s ShareFetch (78) and ShareAcknowledge (79) act on; it reads a
  share-partition's state from the persister when it first needs it and writes every change
  back (Kafka's ``SharePartitionManager``);
- the **group coordinator**'s share groups (``group_service.py``): ShareGroupHeartbeat (76),
  ShareGroupDescribe (77) and the admin APIs (90-92). It initializes a share-partition's
  state with the persister before assigning it, and tells the share-partition manager when a
  group is deleted (``ShareGroupListener.on_group_delete``). ``on_member_leave`` is Kafka's
  ``ShareGroupListener.onMemberLeave``, called when a member's share session goes with its
  connection (as Kafka's ``ShareSessionCache`` calls it), not by the group coordinator.

The broker holds one of each: ``broker.share_persister`` and ``broker.share_listener``
(None until the shell exists). All calls run on the broker's event loop.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from kio.schema.errors import ErrorCode

from headrace.share.partition import PersisterStateBatch, ShareStateWrite

# ReadShareGroupState / ReadShareGroupStateSummary answer start offset -1 for a
# share-partition whose state was initialized without an offset (the reader then applies
# share.auto.offset.reset), as Kafka's ShareCoordinatorShard does.
UNINITIALIZED_START_OFFSET = -1


@dataclass(frozen=True, slots=True)
class ReadStateResult:
    """ReadShareGroupState's answer for one share-partition."""

    error: ErrorCode
    state_epoch: int = 0
    start_offset: int = UNINITIALIZED_START_OFFSET
    state_batches: tuple[PersisterStateBatch, ...] = ()
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class StateSummary:
    """ReadShareGroupStateSummary's answer for one share-partition."""

    error: ErrorCode
    state_epoch: int = 0
    leader_epoch: int = -1
    start_offset: int = UNINITIALIZED_START_OFFSET
    delivery_complete_count: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class StateKey:
    """One share-partition's key: Kafka's ``groupId:topicId:partition``."""

    group_id: str
    topic_id: uuid.UUID
    partition: int


@dataclass(frozen=True, slots=True)
class InitializeEntry:
    key: StateKey
    state_epoch: int
    start_offset: int = UNINITIALIZED_START_OFFSET


@dataclass(frozen=True, slots=True)
class WriteEntry:
    key: StateKey
    leader_epoch: int
    write: ShareStateWrite


@dataclass(frozen=True, slots=True)
class Results:
    """Per-key error codes of a batched call (a key absent from ``errors`` succeeded)."""

    errors: dict[StateKey, ErrorCode] = field(default_factory=dict)


class SharePersister(Protocol):
    """Kafka's ``Persister``. Every call takes many share-partitions at once (the
    coordinator groups them by coordinator and writes each group of them as one batch);
    it never raises for a share-partition's failure: each key gets its own error
    (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS,
    FENCED_LEADER_EPOCH, FENCED_STATE_EPOCH, INVALID_REQUEST, ... as the coordinator
    answered, after the retries Kafka's ``PersisterStateManager`` makes for the retriable
    ones)."""

    async def initialize_state(self, entries: list[InitializeEntry]) -> Results: ...

    async def read_state(self, keys: list[StateKey], leader_epoch: int
                         ) -> dict[StateKey, ReadStateResult]: ...

    async def write_state(self, entries: list[WriteEntry]) -> Results: ...

    async def delete_state(self, keys: list[StateKey]) -> Results: ...

    async def read_state_summary(self, keys: list[StateKey], leader_epoch: int = -1
                                 ) -> dict[StateKey, StateSummary]: ...


class ShareGroupListener(Protocol):
    """What the group coordinator tells the share-partition manager (Kafka's
    ``ShareGroupListener``): a member left or was fenced (its share sessions close and its
    acquired records are released), or the group is gone (its share-partitions are
    dropped from memory; their durable state is deleted through the persister)."""

    def on_member_leave(self, group_id: str, member_id: str) -> None: ...

    def on_group_delete(self, group_id: str) -> None: ...
