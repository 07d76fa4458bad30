"""One module per API key; importing this package fills ``base.HANDLERS``."""

from headrace.broker.handlers import (  # noqa: F401
    api_versions,
    create_partitions,
    create_topics,
    delete_topics,
    describe_cluster,
    describe_configs,
    fetch,
    incremental_alter_configs,
    init_producer_id,
    list_offsets,
    metadata,
    produce,
)
from headrace.broker.handlers.base import HANDLERS, Handler, RequestContext

__all__ = ["HANDLERS", "Handler", "RequestContext"]
