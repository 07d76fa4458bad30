"""One module per API key; importing this package fills ``base.HANDLERS``."""

from headrace.broker.handlers import (  # noqa: F401
    alter_partition_reassignments,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_partitions,
    create_topics,
    delete_groups,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    elect_leaders,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sync_group,
)
from headrace.broker.handlers.base import HANDLERS, Handler, RequestContext

__all__ = ["HANDLERS", "Handler", "RequestContext"]
