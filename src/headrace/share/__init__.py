"""Share groups (KIP-932) as pure state machines (no asyncio, no sockets, time passed in).

- ``partition``: one share-partition on the partition leader — in-flight records, their
  states, delivery counts and acquisition locks (Kafka's ``SharePartition``).
"""
