"""Spark Structured Streaming on headrace: the ``headrace`` PySpark data source.

    from headrace.spark import local_session
    spark = local_session()            # local[2], quiet logs, the source registered
    df = (spark.readStream.format("headrace")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events").load())

Or, in an existing session: ``headrace.spark.register(spark)``. Needs the ``spark`` extra
(``pip install 'headrace[spark]'``) and Java 17+.
"""

from __future__ import annotations

from typing import Any

from headrace.spark.session import local_session, register

__all__ = ["HeadraceDataSource", "local_session", "register"]


def __getattr__(name: str) -> Any:
    if name == "HeadraceDataSource":
        from headrace.spark.source import HeadraceDataSource

        return HeadraceDataSource
    raise AttributeError(name)
