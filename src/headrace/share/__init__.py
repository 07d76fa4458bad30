"""Share groups (KIP-932) as pure state machines (no asyncio, no sockets, time passed in).

- ``partition``: one share-partition on the partition leader — in-flight records, their
  states, delivery counts and acquisition locks (Kafka's ``SharePartition``).
- ``group``: a share group's membership, epochs and the simple assignor, and its records in
  ``__consumer_offsets`` (Kafka's ``ShareGroup`` and ``GroupMetadataManager``).
- ``state``: the share coordinator's durable state in ``__share_group_state`` (Kafka's
  ``ShareCoordinatorShard``, ShareSnapshot / ShareUpdate records).

No shell serves them yet (issue 25).
"""
