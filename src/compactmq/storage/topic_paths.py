"""Where a topic's files and objects live: one topic name as a relative path, safe on any
file system and the same on every broker.

A topic ``persistent://tenant/ns/local`` lives under ``persistent/tenant/ns/local`` in each
area of a data directory (ledgers, compacted views, exports) and under the same key prefix in
an object store. Each part is percent-encoded, dots included, so no name can climb out of its
area ('.' and '..' become ``%2E``), and a part too long for a file system is cut and finished
with a hash of the whole part. The mapping must stay injective (two topics never share a
directory) and stable (data directories written by earlier versions keep opening): the rules
below say how both hold. This module imports nothing of the storage layer, so the ledger
stores, the offloader and the compaction layer can all name a topic's place without importing
the storage engine.
"""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import quote

from ..naming import TopicName

# A name part whose encoding passes this many characters is shortened to its first
# ``_KEPT_CHARS`` characters, the marker ``~`` and the first 16 hex digits of its SHA-1.
_MAX_COMPONENT = 200
_KEPT_CHARS = 150
_SHORTENED = re.compile(r"^.{%d}~[0-9a-f]{16}$" % _KEPT_CHARS, re.DOTALL)


def _path_component(text: str) -> str:
    """A name part as one safe directory name: percent-encoded (dots too, so '.' and '..'
    cannot escape), and shortened with a hash when it would pass filesystem limits.

    The mapping is injective. ``quote`` never writes ``%7E`` (``~`` is one of its safe
    characters) and writes ``%`` only as the start of an escape, so its output names one text.
    A shortened name has one shape (``_SHORTENED``); a short name that happens to have that
    shape gets its ``~`` written ``%7E`` instead, which no other name's encoding contains and
    which no longer has the shape. Every other name maps where it always did, so existing
    data directories keep opening."""
    enc = quote(text, safe="-_=:").replace(".", "%2E")
    if len(enc) > _MAX_COMPONENT:
        return enc[:_KEPT_CHARS] + "~" + hashlib.sha1(text.encode()).hexdigest()[:16]
    if _SHORTENED.match(enc):
        enc = enc.replace("~", "%7E")
        if len(enc) > _MAX_COMPONENT:  # many '~': shorten it too (its hash differs from others')
            return enc[:_KEPT_CHARS] + "~" + hashlib.sha1(text.encode()).hexdigest()[:16]
    return enc


def topic_relpath(topic: str) -> str:
    """``persistent://t/ns/x`` -> ``persistent/t/ns/x`` (each part encoded)."""
    tn = TopicName.parse(topic)
    return os.path.join(*(_path_component(p) for p in (tn.domain, tn.tenant, tn.namespace, tn.local_name)))
