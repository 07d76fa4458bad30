"""Replication's rules as pure state machines (no asyncio, no sockets, time passed in).

- ``epochs``: leader epoch caches — where an epoch ends, a follower's divergence, its
  truncation offset (KIP-101, KIP-279, KIP-320).
- ``leader``: the leader's view of a partition — follower states, ISR with its pending
  change, high watermark over the maximal ISR, acks=all completion (Kafka's ``Partition``).

The shells that carry messages in and out: ``broker.replica_manager.Partition`` (the log
and the waiters), ``broker.handlers.fetch`` (the leader's side of a follower fetch),
``cluster.replica_fetcher`` (the follower's fetch loop), ``broker.cluster_node`` (ISR writes
to ZooKeeper).
"""
