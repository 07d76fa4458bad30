"""A local SparkSession set up for headrace: the right Python, quiet logs, the source
registered. Spark's own settings win if a session already exists."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def register(spark: Any) -> None:
    """Register the ``headrace`` format in ``spark``'s session."""
    from headrace.spark.source import HeadraceDataSource

    spark.dataSource.register(HeadraceDataSource)


def prepare_environment() -> None:
    """Environment Spark's launcher and workers need: this interpreter for Python workers
    (else they start a ``python3`` without pyarrow), loopback for the driver, and a Spark
    home whose Python workers import the installed PySpark (``spark_home_without_zip``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    if "SPARK_HOME" not in os.environ:
        home = spark_home_without_zip()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)


def spark_home_without_zip() -> Path | None:
    """The pip-installed Spark home (``site-packages/pyspark``) as links, except its
    ``python/lib/pyspark.zip``; None when PySpark is not a pip install.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path
    (``PythonUtils.sparkPythonPath``), and a module imported from a zip is compiled from
    source at each start: a worker that Spark launches itself (a streaming source's runner,
    a data source's planner, the daemon) spends about 1.3 s of CPU importing PySpark from
    the zip, 0.4 s from the installed package's cached bytecode. Spark waits a fixed 10 s
    for such a worker to connect back (``PythonWorkerFactory.createSimpleWorker``): on a
    loaded machine the slower start failed queries with "Python worker failed to connect
    back". Without the zip on the path the workers import the same PySpark (the pip package
    is where the zip came from) from site-packages. Thread- and process-safe: the links are
    made in a fresh directory and renamed into place; a home another process made first is
    used as it is."""
    try:
        import pyspark
    except ImportError:
        return None
    real = Path(pyspark.__file__).resolve().parent
    lib = real / "python" / "lib"
    if not (lib / "pyspark.zip").is_file() or not (real / "jars").is_dir():
        return None
    import hashlib

    tag = hashlib.sha1(str(real).encode()).hexdigest()[:10]
    home = Path(tempfile.gettempdir()) / f"headrace-spark-home-{pyspark.__version__}-{tag}"
    if (home / "jars").exists():
        return home
    staging = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    for entry in real.iterdir():
        if entry.name != "python":
            (staging / entry.name).symlink_to(entry)
    (staging / "python" / "lib").mkdir(parents=True)
    for entry in lib.iterdir():
        if entry.name != "pyspark.zip":
            (staging / "python" / "lib" / entry.name).symlink_to(entry)
    try:
        staging.rename(home)
    except OSError:  # another process made it first
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return home if (home / "jars").exists() else None


def local_session(
    app_name: str = "headrace", master: str = "local[2]", conf: dict[str, str] | None = None
) -> Any:
    """``getOrCreate()`` a local session tuned for a small machine and register the source."""
    prepare_environment()
    from pyspark.sql import SparkSession

    log_conf = Path(tempfile.gettempdir()) / "headrace-log4j2.properties"
    if not log_conf.exists() or log_conf.read_text() != _LOG4J2:
        log_conf.write_text(_LOG4J2)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        # -Xss: a query stopped mid-batch matches its error's message (a Python traceback)
        # against a regex in its stream thread, which overflowed the default 1 MB stack
        .config("spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile={log_conf} -Xss16m")
        .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile={log_conf}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def silence_jvm_log(spark: Any) -> None:
    """Turn every logger of ``spark``'s JVM off, ``org.apache.spark`` too: the log4j2
    configuration above names it with a level of its own, which ``setLogLevel`` (the root
    logger's) does not change. For a stop whose errors are not the user's to read."""
    jvm = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setAllLevels(
        jvm.org.apache.logging.log4j.LogManager.ROOT_LOGGER_NAME,
        jvm.org.apache.logging.log4j.Level.OFF)
