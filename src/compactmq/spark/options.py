"""The options of the ``compactmq`` Spark format, parsed once into a ``ReadOptions`` value.

Names follow what users already know. pulsar-spark's: ``service.url``, ``admin.url``, ``topic`` |
``topics`` | ``topicsPattern``, ``startingOffsets`` / ``endingOffsets``, ``startingTime`` /
``endingTime``, ``failOnDataLoss``, ``pulsar.client.*``. Kafka's are aliases: ``subscribe``
(= ``topics``), ``subscribePattern`` (= ``topicsPattern``), ``startingTimestamp`` / ``endingTimestamp``,
``minPartitions``, ``maxRecordsPerPartition``, ``maxOffsetsPerTrigger``. Our own: ``view`` (raw |
compacted | latest), ``includeTombstones``, ``columnar`` (default true; false parses the direct
path's messages one by one, the previous path, for comparison), and ``path`` / ``dataDir`` (a data directory the job can
read: the fast path that reads ledger files instead of asking the broker).

Offsets (``startingOffsets`` / ``endingOffsets``) are ``earliest``, ``latest`` or JSON mapping each
topic (or partition) to a message id. A message id is written as ``"ledger:entry[:batch]"``, as
``{"ledgerId": L, "entryId": E, "batchIndex": B}``, or as the list of (signed) bytes of the id the
client serializes (what pulsar-spark writes). ``startingOffsets`` is inclusive, ``endingOffsets``
exclusive; times are milliseconds since the epoch (or ISO-8601), start inclusive, end exclusive.

Everything here is plain Python (no Spark), so it is tested with dicts.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidConfiguration

VIEWS = ("raw", "compacted", "latest")

#: alias -> canonical option name (compared case-insensitively, as Spark does)
ALIASES = {
    "subscribe": "topics",
    "subscribepattern": "topicspattern",
    "startingtimestamp": "startingtime",
    "endingtimestamp": "endingtime",
    "maxrecordspertrigger": "maxoffsetspertrigger",
    "datadir": "path",
    "data.dir": "path",
}

#: a message id: (ledger_id, entry_id, batch_index); batch_index -1 is "the whole entry"
MessageIdTuple = tuple


#: pulsar.client.* options whose values are secrets (lower case): never shown
SECRET_OPTIONS = frozenset({"authparams"})


class ClientOptions(dict):
    """The ``pulsar.client.*`` options (without the prefix): a dict whose ``repr`` (and so its
    ``str``, a ``ReadOptions``' repr, a Spark input partition's repr) shows ``authParams`` and
    any other secret as ``***``. The values themselves are unchanged: the clients need them."""

    def __repr__(self) -> str:
        return repr(redacted(self))

    __str__ = __repr__


def redacted(client: Mapping[str, Any]) -> dict:
    """``client`` with every secret value replaced by ``***`` (for messages and reprs)."""
    return {
        k: "***" if str(k).lower() in SECRET_OPTIONS or "password" in str(k).lower() else v
        for k, v in client.items()
    }


@dataclass(frozen=True)
class ReadOptions:
    topics: tuple = ()
    topics_pattern: str | None = None
    service_url: str | None = None
    admin_url: str | None = None
    data_dir: str | None = None
    view: str = "raw"
    include_tombstones: bool = False
    starting: Any = "earliest"  # "earliest" | "latest" | {topic: (l, e, b)}
    ending: Any = "latest"
    starting_time: int | None = None
    ending_time: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int = 0
    max_records_per_partition: int = 0
    max_offsets_per_trigger: int = 0
    client: dict = field(default_factory=ClientOptions)  # pulsar.client.* without the prefix
    direct: bool = True  # read files when the data directory is visible
    # dotted strategy classes a topic's compactionStrategy policy may make this read import
    # (view=latest); built-ins are always allowed, any other name is refused (docs/security.md)
    strategy_classes: tuple = ()
    columnar: bool = True  # direct raw/compacted splits parsed as columns (false: the row path)

    def topic_offset(self, which: str, topic: str, partition_base: str | None = None):
        """The start or end bound for one topic partition: "earliest", "latest" or an id tuple."""
        spec = self.starting if which == "start" else self.ending
        if isinstance(spec, str):
            return spec
        for name in (topic, partition_base):
            if name is not None and name in spec:
                return spec[name]
        return "earliest" if which == "start" else "latest"


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InvalidConfiguration(f"option {name}={value!r}: expected true or false")


def _int(name: str, value: Any, minimum: int = 0) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise InvalidConfiguration(f"option {name}={value!r}: expected an integer") from None
    if n < minimum:
        raise InvalidConfiguration(f"option {name}={value!r}: must be >= {minimum}")
    return n


def parse_time(name: str, value: Any) -> int:
    """Milliseconds since the epoch from an integer or an ISO-8601 timestamp (UTC when naive)."""
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        ts = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidConfiguration(f"option {name}={value!r}: expected milliseconds or ISO-8601") from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_dt.UTC)
    return int(ts.timestamp() * 1000)


def parse_message_id(name: str, value: Any) -> MessageIdTuple:
    """``(ledger, entry, batch)`` from any accepted spelling of a message id."""
    if isinstance(value, str):
        parts = value.split(":")
        if 2 <= len(parts) <= 3 and all(re.fullmatch(r"-?\d+", p) for p in parts):
            nums = [int(p) for p in parts] + [-1]
            return (nums[0], nums[1], nums[2])
    elif isinstance(value, dict):
        try:
            return (int(value["ledgerId"]), int(value["entryId"]), int(value.get("batchIndex", -1)))
        except (KeyError, TypeError, ValueError):
            pass
    elif isinstance(value, list) and all(isinstance(b, int) for b in value):
        from .messages import deserialize_message_id

        try:
            ledger, entry, batch, _ = deserialize_message_id(bytes(b & 0xFF for b in value))
            return (ledger, entry, batch)
        except ValueError:
            pass
    raise InvalidConfiguration(
        f'option {name}: {value!r} is not a message id (use "ledger:entry[:batch]", '
        '{"ledgerId":..,"entryId":..} or the serialized id\'s bytes)'
    )


def parse_offsets(name: str, value: Any, default: str):
    if value is None:
        return default
    text = str(value).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        raise InvalidConfiguration(f"option {name}={value!r}: expected earliest, latest or JSON") from None
    if not isinstance(spec, dict):
        raise InvalidConfiguration(f"option {name}: JSON must map topics to message ids")
    from ..naming import canonical

    out = {}
    for topic, mid in spec.items():
        if isinstance(mid, str) and mid.lower() in ("earliest", "latest"):
            out[canonical(topic)] = mid.lower()
        else:
            out[canonical(topic)] = parse_message_id(name, mid)
    return out


def normalize(options: Mapping[str, Any]) -> dict:
    """Lower-cased keys with aliases resolved; an alias and its name both set is an error."""
    out: dict = {}
    for key, value in options.items():
        k = key.lower()
        k = ALIASES.get(k, k)
        if k in out and out[k] != value:
            raise InvalidConfiguration(f"option {key} conflicts with another spelling of the same option")
        out[k] = value
    return out


def parse_read_options(options: Mapping[str, Any], *, streaming: bool = False) -> ReadOptions:
    """Validate the options of a read; ``InvalidConfiguration`` with one clear line otherwise."""
    from ..naming import canonical

    o = normalize(options)
    chosen = [k for k in ("topic", "topics", "topicspattern") if o.get(k)]
    if len(chosen) != 1:
        raise InvalidConfiguration(
            "set exactly one of the options topic, topics (Kafka: subscribe) or topicsPattern "
            "(Kafka: subscribePattern)"
        )
    topics: tuple = ()
    pattern = None
    if chosen[0] == "topicspattern":
        pattern = str(o["topicspattern"]).strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise InvalidConfiguration(f"option topicsPattern={pattern!r}: {e}") from None
    else:
        names = [t.strip() for t in str(o[chosen[0]]).split(",") if t.strip()]
        if chosen[0] == "topic" and len(names) != 1:
            raise InvalidConfiguration("option topic names one topic; use topics for a list")
        topics = tuple(dict.fromkeys(canonical(t) for t in names))
    view = str(o.get("view", "raw")).strip().lower()
    if view not in VIEWS:
        raise InvalidConfiguration(f"option view={view!r}: use raw, compacted or latest")
    data_dir = o.get("path") or None
    service_url = o.get("service.url") or None
    if not data_dir and not service_url:
        raise InvalidConfiguration("set service.url (the broker) or path (a data directory to read directly)")
    client = ClientOptions(
        (k[len("pulsar.client.") :], v) for k, v in o.items() if k.startswith("pulsar.client.")
    )
    starting = parse_offsets(
        "startingOffsets", o.get("startingoffsets"), "latest" if streaming else "earliest"
    )
    ending = parse_offsets("endingOffsets", o.get("endingoffsets"), "latest")
    if streaming and "endingoffsets" in o:
        raise InvalidConfiguration("option endingOffsets is for batch reads only")
    if ending == "earliest":
        raise InvalidConfiguration("option endingOffsets=earliest reads nothing; use latest or message ids")
    return ReadOptions(
        topics=topics,
        topics_pattern=pattern,
        service_url=service_url,
        admin_url=o.get("admin.url") or None,
        data_dir=str(data_dir) if data_dir else None,
        view=view,
        include_tombstones=_bool("includeTombstones", o.get("includetombstones", False)),
        starting=starting,
        ending=ending,
        starting_time=parse_time("startingTime", o["startingtime"]) if o.get("startingtime") else None,
        ending_time=parse_time("endingTime", o["endingtime"]) if o.get("endingtime") else None,
        fail_on_data_loss=_bool("failOnDataLoss", o.get("failondataloss", True)),
        min_partitions=_int("minPartitions", o.get("minpartitions", 0)),
        max_records_per_partition=_int("maxRecordsPerPartition", o.get("maxrecordsperpartition", 0)),
        max_offsets_per_trigger=_int("maxOffsetsPerTrigger", o.get("maxoffsetspertrigger", 0)),
        client=client,
        direct=_bool("direct", o.get("direct", True)),
        strategy_classes=tuple(
            c.strip() for c in str(o.get("compactionstrategyclasses") or "").split(",") if c.strip()
        ),
        columnar=_bool("columnar", o.get("columnar", True)),
    )


# --- pulsar.client.* ------------------------------------------------------------------------------

#: pulsar.client.<Java ClientBuilder name> -> keyword of the Python pulsar.Client
_CLIENT_KWARGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "operationtimeoutms": ("operation_timeout_seconds", lambda v: max(1, int(v) // 1000)),
    "operationtimeoutseconds": ("operation_timeout_seconds", int),
    "connectiontimeoutms": ("connection_timeout_ms", int),
    "iothreads": ("io_threads", int),
    "tlstrustcertsfilepath": ("tls_trust_certs_file_path", str),
    "tlsallowinsecureconnection": (
        "tls_allow_insecure_connection",
        lambda v: _bool("tlsAllowInsecureConnection", v),
    ),
    "tlsvalidatehostname": ("tls_validate_hostname", lambda v: _bool("tlsValidateHostname", v)),
    # the Java client's name for the same switch (ClientBuilder.enableTlsHostnameVerification)
    "tlshostnameverificationenable": (
        "tls_validate_hostname",
        lambda v: _bool("tlsHostnameVerificationEnable", v),
    ),
    "tlscertificatefilepath": ("tls_certificate_file_path", str),
    "tlskeyfilepath": ("tls_private_key_file_path", str),
}


def client_kwargs(client: Mapping[str, Any]) -> dict:
    """Keyword arguments of ``pulsar.Client`` from the ``pulsar.client.*`` options (Java names,
    as pulsar-spark passes them through): auth plugin and params, TLS files, timeouts."""
    kw: dict = {}
    plugin = params = None
    for key, value in client.items():
        k = key.lower()
        if k == "authpluginclassname":
            plugin = str(value)
        elif k == "authparams":
            params = str(value)
        elif k in _CLIENT_KWARGS:
            name, conv = _CLIENT_KWARGS[k]
            try:
                kw[name] = conv(value)
            except (TypeError, ValueError):
                raise InvalidConfiguration(f"option pulsar.client.{key}={value!r} is not valid") from None
        else:
            raise InvalidConfiguration(f"option pulsar.client.{key} is not supported by the Python client")
    if plugin or params:
        kw["authentication"] = _authentication(plugin, params)
    # over pulsar+ssl:// the source sends its credentials: check the broker's certificate names
    # the host it dialled, unless told not to (or told to trust any certificate), as its admin
    # HTTPS calls do (admin_ssl_context). The Python client's own default is off.
    kw.setdefault("tls_validate_hostname", not kw.get("tls_allow_insecure_connection", False))
    return kw


def auth_params(params: str | None) -> dict:
    """``authParams`` as the Java client reads them: a JSON object, or ``key:value`` pairs
    separated by commas (``tlsCertFile:/c.pem,tlsKeyFile:/k.pem``, ``userId:u,password:p``)."""
    text = (params or "").strip()
    if not text:
        return {}
    if text[0] in "{[":
        try:
            value = json.loads(text)
        except ValueError:
            raise InvalidConfiguration("option pulsar.client.authParams is not valid JSON") from None
        if not isinstance(value, dict):
            raise InvalidConfiguration("option pulsar.client.authParams must be a JSON object")
        return {str(k): str(v) for k, v in value.items()}
    out = {}
    for pair in text.split(","):
        key, sep, value = pair.partition(":")
        if not sep:
            raise InvalidConfiguration(
                "option pulsar.client.authParams: expected JSON or key:value pairs separated by commas"
            )
        out[key.strip()] = value.strip()
    return out


def _plugin_kind(plugin: str | None) -> str:
    """token | basic | tls | '' (another plugin) from a Java class name or a short name."""
    name = (plugin or "").lower()
    for kind in ("token", "basic", "tls"):
        if name.endswith("authentication" + kind) or name == kind:
            return kind
    return ""


def _basic_credentials(params: str | None) -> tuple[str, str]:
    """(user, password) of basic auth: Java's ``{"userId", "password"}`` (also ``username``, the
    C++ client's key), or ``userId:u,password:p``."""
    p = auth_params(params)
    user = p.get("userId", p.get("username"))
    if user is None or "password" not in p:
        raise InvalidConfiguration(
            'option pulsar.client.authParams of basic auth needs {"userId": ..., "password": ...}'
        )
    return user, p["password"]


def _tls_files(params: str | None) -> tuple[str, str]:
    """(certificate, key) files of the TLS auth plugin's ``tlsCertFile`` / ``tlsKeyFile``."""
    p = auth_params(params)
    if not p.get("tlsCertFile") or not p.get("tlsKeyFile"):
        raise InvalidConfiguration(
            "option pulsar.client.authParams of TLS auth needs tlsCertFile:<file>,tlsKeyFile:<file>"
        )
    return p["tlsCertFile"], p["tlsKeyFile"]


def _authentication(plugin: str | None, params: str | None):
    import pulsar

    if not plugin:
        raise InvalidConfiguration("pulsar.client.authParams needs pulsar.client.authPluginClassName")
    kind = _plugin_kind(plugin)
    if kind == "token":
        token = (params or "").strip()
        token = token.removeprefix("token:")
        return pulsar.AuthenticationToken(token)
    if kind == "basic":  # the C++ client names the user "username", Java "userId"
        user, password = _basic_credentials(params)
        return pulsar.AuthenticationBasic(user, password)
    if kind == "tls":
        cert, key = _tls_files(params)
        return pulsar.AuthenticationTLS(cert, key)
    return pulsar.Authentication(plugin, params or "")


def admin_headers(client: Mapping[str, Any]) -> dict:
    """HTTP headers for the admin REST calls made with the same credentials (token / basic; a TLS
    client certificate goes into the TLS context instead, see ``admin_ssl_context``)."""
    import base64

    lowered = {k.lower(): v for k, v in client.items()}
    kind = _plugin_kind(str(lowered.get("authpluginclassname", "")))
    params = str(lowered.get("authparams", "")).strip()
    if kind == "token":
        token = params.removeprefix("token:")
        return {"Authorization": f"Bearer {token}"}
    if kind == "basic":
        user, password = _basic_credentials(params)
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _validate_hostname(lowered: Mapping[str, Any]) -> bool:
    """tlsValidateHostname / tlsHostnameVerificationEnable (either; default true)."""
    for key in ("tlsvalidatehostname", "tlshostnameverificationenable"):
        if str(lowered.get(key, "true")).strip().lower() in ("false", "0", "no"):
            return False
    return True


def admin_ssl_context(client: Mapping[str, Any]):
    """The TLS context of admin REST calls over ``https://``: the same trust store (and client
    certificate) as the binary protocol's ``pulsar.client.tls*`` options; None: Python's defaults."""
    import ssl

    lowered = {k.lower(): v for k, v in client.items()}
    trust = lowered.get("tlstrustcertsfilepath")
    cert, key = lowered.get("tlscertificatefilepath"), lowered.get("tlskeyfilepath")
    if _plugin_kind(str(lowered.get("authpluginclassname", ""))) == "tls":  # the role's certificate
        cert, key = _tls_files(str(lowered.get("authparams", "")))
    insecure = str(lowered.get("tlsallowinsecureconnection", "false")).strip().lower() in ("true", "1", "yes")
    if not (trust or cert or insecure):
        return None
    ctx = ssl.create_default_context(cafile=str(trust) if trust else None)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif not _validate_hostname(lowered):
        ctx.check_hostname = False
    if cert and key:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx
