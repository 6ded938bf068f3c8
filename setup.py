"""Build step for the compiled parts of compactmq; everything else is in pyproject.toml.

``compactmq.compaction._scan`` is the C loop of compaction's entry scanner (see
``compactmq/compaction/native.py``). It is optional: without a C compiler the install succeeds
and compaction uses the numpy reference code, logging once that it does.

``compactmq.protocol._wire`` is the C twin of the broker's per-message wire readers and writers
(see ``compactmq/protocol/wire.py``), optional the same way: without it the pure-Python twin runs.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "compactmq.compaction._scan",
            sources=["src/compactmq/compaction/_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "compactmq.protocol._wire",
            sources=["src/compactmq/protocol/_wire.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
