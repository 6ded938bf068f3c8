"""Build step for the one compiled part of compactmq; everything else is in pyproject.toml.

``compactmq.compaction._scan`` is the C loop of compaction's entry scanner (see
``compactmq/compaction/native.py``). It is optional: without a C compiler the install succeeds
and compaction uses the numpy reference code, logging once that it does.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "compactmq.compaction._scan",
            sources=["src/compactmq/compaction/_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
