"""``headrace.spark.session.spark_home_without_zip``: the Spark home the sessions use, so
that Python workers import the installed PySpark (cached bytecode) instead of
``python/lib/pyspark.zip`` (compiled at every start; slow enough on a loaded machine to miss
Spark's fixed 10 s for a worker to connect back)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from headrace.spark.session import spark_home_without_zip  # noqa: E402

REAL = Path(pyspark.__file__).resolve().parent


def test_the_home_is_the_pip_package_without_the_zip() -> None:
    home = spark_home_without_zip()
    assert home is not None and home != REAL
    assert (home / "jars").resolve() == REAL / "jars"
    assert (home / "bin" / "spark-submit").resolve() == REAL / "bin" / "spark-submit"
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    assert sorted(p.name for p in (home / "python" / "lib").iterdir()) == sorted(
        p.name for p in (REAL / "python" / "lib").iterdir() if p.name != "pyspark.zip")
    assert spark_home_without_zip() == home  # made once, then reused


def test_a_worker_path_from_this_home_imports_the_installed_pyspark() -> None:
    """A worker's path as Spark builds it (``PythonUtils.sparkPythonPath``: the home's
    ``python/lib`` zips first) finds PySpark in site-packages, with its bytecode cache."""
    home = spark_home_without_zip()
    assert home is not None
    lib = home / "python" / "lib"
    path = os.pathsep.join(str(p) for p in (lib / "pyspark.zip", *lib.glob("py4j-*.zip")))
    r = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                       env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                       timeout=60, check=True)
    assert Path(r.stdout.strip()).resolve() == REAL / "__init__.py"
    real = os.pathsep.join(str(p) for p in (REAL / "python" / "lib").glob("*.zip"))
    r = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                       env={**os.environ, "PYTHONPATH": real}, capture_output=True, text=True,
                       timeout=60, check=True)
    assert "pyspark.zip" in r.stdout  # what the workers imported before
