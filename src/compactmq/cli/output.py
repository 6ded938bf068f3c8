"""How the CLI prints results: one object with a text and a JSON rendering (``--output``)."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, TextIO


class Output:
    def __init__(self, mode: str = "text", stream: TextIO | None = None):
        self.mode = mode
        self.stream = stream or sys.stdout

    @property
    def json(self) -> bool:
        return self.mode == "json"

    def result(self, body: Any, text: Callable[[Any], str] | None = None) -> None:
        """Print ``body``: in JSON mode as one JSON document, else through ``text`` (or pretty JSON)."""
        if self.json:
            self.stream.write(json.dumps(body, sort_keys=True) + "\n")
            return
        rendered = text(body) if text else _pretty(body)
        if rendered:
            self.stream.write(rendered.rstrip("\n") + "\n")

    def done(self, message: str) -> None:
        """A command with no response body: a line in text mode, ``{}``-less silence in JSON mode."""
        if self.json:
            self.stream.write(json.dumps({"result": "ok", "message": message}) + "\n")
        else:
            self.stream.write(message + "\n")


def _pretty(body: Any) -> str:
    if body is None:
        return ""
    if isinstance(body, (list, tuple)) and all(isinstance(x, str) for x in body):
        return "\n".join(body)
    if isinstance(body, (dict, list)):
        return json.dumps(body, indent=2, sort_keys=True)
    return str(body)
