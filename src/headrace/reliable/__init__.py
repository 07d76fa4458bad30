"""Storm-grade guaranteed processing for Kafka consumers (SPEC R-REL-1..6).

Pure cores (no I/O, time passed in): ``Acker``/``AckerPool`` (XOR of item ids per root),
``TupleTracker``/``Item`` (anchoring, ack, fail), ``OffsetManager`` (KafkaSpout's commit
discipline, one per partition), ``ReliableSpout`` (records in, effects out) and
``ShareSpout`` (a share group's records in, acknowledgements out). The shell:
``ReliableConsumer`` over confluent-kafka, running a ``Topology`` of basic, explicit, batch,
async or process bolts (``process_bolt``: CPU-bound handlers in worker processes).
Exactly-once output helpers: ``IdempotentSqliteSink`` and ``SqliteOffsetStore``.
"""

from headrace.reliable.acker import Acker, AckerPool, RootCompleted, RootFailed
from headrace.reliable.consumer import ReliableConsumer
from headrace.reliable.errors import ReliableConfigError, ReliableUsageError
from headrace.reliable.exactly_once import (
    IdempotentSqliteSink,
    SqliteOffsetStore,
    idempotent_key,
)
from headrace.reliable.offsets import OffsetManager
from headrace.reliable.share_spout import (
    Acknowledge,
    AckType,
    ShareEffect,
    ShareRootBatch,
    ShareSpout,
    ShareSpoutConfig,
)
from headrace.reliable.spout import (
    Commit,
    DeadLetter,
    Effect,
    Pause,
    ReliableSpout,
    Resume,
    RootBatch,
    Seek,
    SpoutBase,
    SpoutConfig,
    TopicPartition,
)
from headrace.reliable.topology import (
    BasicOutputCollector,
    Batch,
    OutputCollector,
    Record,
    Topology,
)
from headrace.reliable.tuples import ChildItem, ChildRun, Item, ItemState, RootItem, TupleTracker

__all__ = [
    "AckType",
    "Acker",
    "AckerPool",
    "Acknowledge",
    "BasicOutputCollector",
    "Batch",
    "ChildItem",
    "ChildRun",
    "Commit",
    "DeadLetter",
    "Effect",
    "IdempotentSqliteSink",
    "Item",
    "ItemState",
    "OffsetManager",
    "OutputCollector",
    "Pause",
    "Record",
    "ReliableConfigError",
    "ReliableConsumer",
    "ReliableSpout",
    "ReliableUsageError",
    "Resume",
    "RootBatch",
    "RootCompleted",
    "RootFailed",
    "RootItem",
    "Seek",
    "ShareEffect",
    "ShareRootBatch",
    "ShareSpout",
    "ShareSpoutConfig",
    "SpoutBase",
    "SpoutConfig",
    "SqliteOffsetStore",
    "TopicPartition",
    "Topology",
    "TupleTracker",
    "idempotent_key",
]
