"""PURE: what every group kept by the coordinator offers, whatever its protocol.

The registry ``GroupCoordinator.groups: dict[str, Group]`` (``headrace.group.coordinator``)
holds classic groups (``headrace.group.classic.ClassicGroup``, JoinGroup/SyncGroup) and
KIP-848 consumer groups (``headrace.group.consumer_group.ConsumerGroup``,
ConsumerGroupHeartbeat) side by side; a group id belongs to exactly one kind at a time.
Offsets are kept by the coordinator, not by the group objects: a group only decides
whether a member may commit (``validate_offset_commit``) or fetch (``validate_offset_fetch``).

The asyncio shell (``headrace.broker.group_service.GroupService``, ``broker.groups``)
offers the protocol handlers:

- ``broker.groups.coordinator``: the pure ``GroupCoordinator`` (``.groups``, offsets);
- ``broker.groups.check_coordinator(group_id) -> ErrorCode``: NOT_COORDINATOR if this broker
  does not lead the group's ``__consumer_offsets`` partition, COORDINATOR_LOAD_IN_PROGRESS
  while that partition is being loaded, COORDINATOR_NOT_AVAILABLE if the topic cannot be
  created, else NONE (it creates ``__consumer_offsets`` on first use);
- ``broker.groups.config``: the ``BrokerConfig``;
- ``await broker.groups.append_group_records(group_id, [(key, value_or_None), ...])
  -> ErrorCode``: append to the group's partition, acks=all (waits for the high watermark).

Time is an argument (``now_ms``) everywhere; ``tick`` is called by the shell about every
100 ms to expire sessions and timeouts.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kio.schema.errors import ErrorCode

GROUP_TYPE_CLASSIC = "classic"
GROUP_TYPE_CONSUMER = "consumer"


@runtime_checkable
class Group(Protocol):
    group_id: str

    @property
    def group_type(self) -> str:
        """``"classic"`` or ``"consumer"`` (ListGroups v5 ``group_type``)."""
        ...

    @property
    def protocol_type(self) -> str:
        """``"consumer"`` usually; ``""`` for an empty classic group with no protocol."""
        ...

    @property
    def state_name(self) -> str:
        """Kafka's state names: classic ``Empty``, ``PreparingRebalance``,
        ``CompletingRebalance``, ``Stable``, ``Dead``; KIP-848 ``Empty``, ``Assigning``,
        ``Reconciling``, ``Stable``, ``Dead``."""
        ...

    def is_empty(self) -> bool:
        """No members (DeleteGroups needs this; an empty group may be expired)."""
        ...

    def validate_offset_commit(
        self, member_id: str, generation_or_epoch: int, group_instance_id: str | None,
        now_ms: int,
    ) -> ErrorCode:
        """``ErrorCode.none`` if this member may commit now, else Kafka's error for it."""
        ...

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        """``ErrorCode.none`` if the fetch is allowed (OffsetFetch v9 carries member id and
        epoch; older versions pass ``None`` and -1, which is always allowed)."""
        ...

    def tick(self, now_ms: int) -> object:
        """Expire sessions and timeouts up to ``now_ms``: True if anything changed (a share
        group returns its ``TickResult``; the coordinator handles it apart)."""
        ...
