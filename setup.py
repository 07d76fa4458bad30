"""Only the C part of the build (the rest is pyproject.toml): ``headrace._speedups``, the
produce path's per-record check. ``optional``: where it cannot be compiled, headrace runs
its numpy path instead (``headrace/log/validator.py``)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "headrace._speedups",
            ["src/headrace/_speedups.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
