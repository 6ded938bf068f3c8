"""``compactmq topics get-latest T --key K [--key K2 ...]``: a key's latest value, from the broker.

The keys go in one ``POST .../latest`` (``admin.latest`` describes the answer), so that a key
without a value is an answer and a 404 only ever means the topic does not exist. Text output is one line per key::

    k1  value=hello  id=12:7:-1:3  publishTime=1764170000000  properties={"a": "b"}
    k2  (no value)

the value shown as UTF-8 when it decodes, else as ``base64:...`` (``--value-format base64``
always shows base64). JSON output (``--output json``) is the REST answer: one object for one key,
a list for several. The command exits 1 when a key has no value (never written, or deleted), so
scripts can test for it.
"""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any

from .admin import AdminClient, _run, topic_path
from .output import Output


def add_commands(topics) -> None:
    """Add ``get-latest`` to the ``topics`` subcommands."""
    p = topics.add_parser(
        "get-latest", help="show the latest value of keys (the compacted view plus the tail, as a TableView)"
    )
    p.add_argument("topic")
    p.add_argument("-k", "--key", action="append", required=True, help="a key (repeat for several)")
    p.add_argument(
        "--value-format",
        choices=("auto", "base64"),
        default="auto",
        help="auto: UTF-8 when the value decodes, else base64",
    )
    p.set_defaults(func=_run(get_latest))


def get_latest(a: argparse.Namespace, c: AdminClient, out: Output) -> int:
    # always the POST: a key without a value is then an answer, and a 404 only ever means that
    # the topic does not exist (an error, printed as such)
    listed: list = c.request("POST", f"{topic_path(a.topic)}/latest", a.key) or []
    body: Any = listed[0] if len(a.key) == 1 and listed else listed
    out.result(body, lambda _: "\n".join(render(x, a.value_format) for x in listed))
    return 0 if all(x.get("found") for x in listed) else 1


def render(answer: dict, value_format: str = "auto") -> str:
    """One key's answer on one line."""
    key = answer.get("key")
    if not answer.get("found"):
        return f"{key}  (no value)"
    value = answer.get("value") or ""
    shown = f"base64:{value}"
    if value_format == "auto":
        try:
            shown = base64.b64decode(value).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            pass
    mid = answer.get("messageId") or {}
    ident = ":".join(str(mid.get(k, -1)) for k in ("ledgerId", "entryId", "partitionIndex", "batchIndex"))
    line = f"{key}  value={shown}  id={ident}  publishTime={answer.get('publishTime')}"
    if answer.get("eventTime"):
        line += f"  eventTime={answer['eventTime']}"
    if answer.get("properties"):
        line += f"  properties={json.dumps(answer['properties'], sort_keys=True)}"
    return line
