"""Reading through the broker's public interfaces: the official client and the admin REST API.

This path works from any cluster that can reach the broker, with the credentials of any client
(``pulsar.client.*`` options; the same token or basic credentials go to the admin API). Each task
opens its own ``pulsar.Client`` and a *reader* (no subscription is created on the topic):

* a ``raw`` range is read with a plain reader started, inclusively, at its first entry;
* a ``compacted`` range with ``is_read_compacted=True``, so the broker serves its compacted view;
* a range stops at its end id, or when the reader has nothing more (``has_message_available``).

Planning uses the admin API when ``admin.url`` is set: ``internalStats`` lists each partition's
ledgers (one split per ledger, as on the direct path) and its compaction horizon;
``/partitions`` resolves partitioned topics and the namespace listing resolves ``topicsPattern``.
Without ``admin.url`` a partition is one split, bounded by the last message id the broker reports
at planning time, and the partitions come from the client's lookup.

Who may plan with splits: ``internalStats`` is Pulsar's GET_STATS topic operation, which any role
allowed to look the topic up (``produce`` or ``consume``) may call, so a consume-only role reads
in parallel splits like an admin. A broker that refuses it (HTTP 403, e.g. a stricter
authorization provider) degrades the read to one split per partition, with one warning per read.
The topic's compaction strategy (for ``latest``) is a topic policy, which only a tenant admin
reads; any other role folds with the default ``keep-latest``, again with one warning.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from ..admin.policies import rest_path
from ..config import policy_keys as pk
from ..errors import CompactMQError, InvalidConfiguration, TopicNotFound
from .messages import Message
from .options import ClientOptions, admin_headers, admin_ssl_context, client_kwargs
from .plan import Layout, Split
from .values import TopicSchema

READ_TIMEOUT_MS = 2000
#: probes of where a compacted view's entries sit, per topic partition (``probe_view``)
VIEW_PROBES = 48
#: a view with fewer entries is not probed: however it is cut, its splits are small
PROBE_MIN_ENTRIES = 128
log = logging.getLogger(__name__)


class BrokerError(CompactMQError):
    """The broker or its admin API refused or failed a request the source needed."""


class Forbidden(BrokerError):
    """The admin API answered 403: the role is authenticated but lacks the grant."""


def open_client(service_url: str, client_options: dict):
    import pulsar

    kw = client_kwargs(client_options)
    kw.setdefault("operation_timeout_seconds", 30)
    return pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **kw)


class BrokerBackend:
    def __init__(self, service_url: str, admin_url: str | None, client_options: dict):
        self.service_url = service_url
        self.admin_url = admin_url.rstrip("/") if admin_url else None
        self.client_options = ClientOptions(client_options)  # its repr hides authParams
        self.headers = admin_headers(client_options)
        self.ssl_context = admin_ssl_context(client_options)
        self._client = None
        self.warned: set[str] = set()  # what this read has already warned about (once each)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self.warned:
            self.warned.add(what)
            log.warning(message)

    @property
    def client(self):
        if self._client is None:
            self._client = open_client(self.service_url, self.client_options)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- admin REST ------------------------------------------------------------------------

    def _get(self, path: str):
        if not self.admin_url:
            raise InvalidConfiguration("this read needs the admin API: set the admin.url option")
        req = urllib.request.Request(self.admin_url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                reason = json.loads(e.read()).get("reason", "")
            except Exception:  # noqa: BLE001
                reason = ""
            if e.code == 404:
                raise TopicNotFound(f"{path}: {reason or 'not found'}") from None
            if e.code in (401, 403):
                what = "authentication failed" if e.code == 401 else "not authorized"
                raise (BrokerError if e.code == 401 else Forbidden)(
                    f"admin API {path}: HTTP {e.code} {what} (check pulsar.client.authParams)"
                    f"{': ' + reason if reason else ''}"
                ) from None
            raise BrokerError(f"admin API {path}: HTTP {e.code} {reason}".strip()) from None
        except OSError as e:
            raise BrokerError(f"admin API at {self.admin_url} is not reachable: {e}") from None

    @staticmethod
    def _rest(topic: str) -> str:
        from ..naming import TopicName

        t = TopicName.parse(topic)
        q = urllib.parse.quote
        return f"/admin/v2/{t.domain}/{q(t.tenant)}/{q(t.namespace)}/{q(t.local_name, safe='')}"

    # --- planning ----------------------------------------------------------------------------

    def partitions(self, topics: tuple, pattern: str | None) -> list[tuple[str, int]]:
        from ..naming import TopicName

        if pattern is not None:
            if not self.admin_url:
                raise InvalidConfiguration("topicsPattern through the broker needs admin.url")
            m = re.match(r"^(persistent|non-persistent)://([^/]+)/([^/]+)/", pattern)
            domain, tenant, ns = (
                (m.group(1), m.group(2), m.group(3)) if m else ("persistent", "public", "default")
            )
            names = self._get(f"/admin/v2/{domain}/{tenant}/{ns}") or []
            parted = set(self._get(f"/admin/v2/{domain}/{tenant}/{ns}/partitioned") or [])
            bases = {
                str(TopicName.parse(n).partitioned_base)
                if str(TopicName.parse(n).partitioned_base) in parted
                else n
                for n in names
            } | parted
            regex = re.compile(pattern)
            topics = tuple(
                sorted(t for t in bases if regex.fullmatch(t) or regex.fullmatch(t.split("://", 1)[-1]))
            )
        out = []
        for t in topics:
            if self.admin_url:
                n = int((self._get(self._rest(t) + "/partitions") or {}).get("partitions", 0))
                if n:
                    out.extend((str(TopicName.parse(t).partition(i)), i) for i in range(n))
                else:
                    out.append((t, TopicName.parse(t).partition_index))
            else:
                try:
                    names = self.client.get_topic_partitions(t)
                except Exception as e:  # noqa: BLE001 - pulsar.Timeout, AuthenticationError, ...
                    raise BrokerError(refused(self.service_url, f"looking up {t}", e)) from None
                if len(names) == 1 and names[0] == t:
                    out.append((t, TopicName.parse(t).partition_index))
                else:
                    out.extend((n, TopicName.parse(n).partition_index) for n in names)
        return out

    def layout(self, topic: str, partition: int, with_view: bool) -> Layout:
        from .compacted_view import CompactedView

        stats = None
        if self.admin_url:
            try:
                stats = self._get(self._rest(topic) + "/internalStats")
            except Forbidden as e:  # a broker that keeps stats to admins: plan without them
                self._warn_once(
                    "stats",
                    f"{e}; reading one split per topic partition (no per-ledger splits without "
                    "internalStats: grant the role produce or consume, or use an admin role)",
                )
                stats = None
        if stats is not None:
            ledgers = tuple(
                (int(li["ledgerId"]), int(li["entries"]))
                for li in stats.get("ledgers", [])
                if int(li["entries"]) > 0
            )
            last = _position(stats.get("lastConfirmedEntry"))
            first = (ledgers[0][0], 0) if ledgers else None
            horizon = _position(stats.get("compactionHorizon"))
            view = None
            if with_view:
                policies = self._compaction_policies(topic)
                entries = int((stats.get("compactedLedger") or {}).get("entries") or 0)
                spans = ()
                if horizon is not None and entries >= PROBE_MIN_ENTRIES:
                    spans = self.probe_view(topic, partition, ledgers, horizon)
                view = CompactedView(
                    None,
                    horizon,
                    None,
                    policies.get("strategy") or "keep-latest",
                    bool(policies.get("retain_null_key", False)),
                    spans=spans,
                )
            return Layout(topic, partition, ledgers, first, last, view)
        last = self.last_message_id(topic, compacted=False)
        return Layout(topic, partition, (), None, last, None)

    def probe_view(
        self, topic: str, partition: int, ledgers: tuple, horizon: tuple, probes: int = VIEW_PROBES
    ):
        """Where the entries of ``topic``'s compacted view sit among its source entries:
        ``((ledger, first entry, stop entry), ...)`` (see ``plan``: a split through the broker is
        cut at equal shares of these). Empty when not probed.

        The broker shows no index of a view, but a read-compacted reader started at a source
        entry id receives the view's first entry at or after it. So ``probes`` readers started
        at evenly spaced source entries tell, for each stretch between two probes, that nothing
        before the answer is in the view; what follows it up to the next probe is counted as in
        the view. That is exact where the view is dense (the usual shape: survivors gather at
        the end of the log) and an overestimate where it is sparse, which errs towards even cuts.
        Each probe is one reader (a few ms); a failure leaves the view unprobed.
        """
        ranges = [
            (lid, min(count, horizon[1] + 1) if lid == horizon[0] else count)
            for lid, count in ledgers
            if lid <= horizon[0]
        ]
        if not ranges or len(ranges) > probes:  # enough ledgers: the splits per ledger suffice
            return ()
        stride = max(1, -(-sum(n for _, n in ranges) // probes))
        spans = []
        try:
            for lid, stop in ranges:
                for a in range(0, stop, stride):
                    b = min(a + stride, stop)
                    found = self._first_in_view(topic, partition, (lid, a), horizon)
                    if found is not None and found[0] == lid and found[1] < b:
                        spans.append((lid, found[1], b))
        except Exception as e:  # noqa: BLE001 - pulsar.Timeout, ConnectError, ...: plan without
            self._warn_once("probe", f"{topic}: probing the compacted view failed ({e}); cutting it evenly")
            return ()
        return tuple(spans)

    def _first_in_view(self, topic: str, partition: int, at: tuple, horizon: tuple) -> tuple | None:
        """Position of the first entry of the compacted view at or after ``at`` (None: none up
        to the horizon)."""
        import pulsar

        reader = self.client.create_reader(
            topic,
            pulsar.MessageId(partition, at[0], at[1], -1),
            start_message_id_inclusive=True,
            is_read_compacted=True,
            receiver_queue_size=1,
        )
        try:
            if not reader.has_message_available():
                return None
            mid = reader.read_next(READ_TIMEOUT_MS * 5).message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            return pos if pos <= tuple(horizon) else None
        finally:
            reader.close()

    def _compaction_policies(self, topic: str) -> dict:
        out = {}
        for key, policy in (("strategy", pk.COMPACTION_STRATEGY), ("retain_null_key", pk.RETAIN_NULL_KEY)):
            name = rest_path(policy)
            try:
                value = self._get(self._rest(topic) + f"/{name}?applied=true")
            except Forbidden:
                self._warn_once(
                    "policies",
                    f"{topic}: the role may not read the topic's {name} policy (tenant admin only); "
                    "the latest view folds with the defaults (keep-latest, null keys dropped)",
                )
                continue
            except (TopicNotFound, BrokerError):
                continue
            if value not in (None, ""):
                out[key] = value
        return out

    def last_message_id(self, topic: str, compacted: bool) -> tuple | None:
        """The last id the broker holds (a reader started inclusively at ``latest``)."""
        import pulsar

        reader = self.client.create_reader(
            topic, pulsar.MessageId.latest, start_message_id_inclusive=True, is_read_compacted=compacted
        )
        try:
            if not reader.has_message_available():
                return None
            mid = reader.read_next(READ_TIMEOUT_MS * 5).message_id()
            return (mid.ledger_id(), mid.entry_id())
        finally:
            reader.close()

    def schema(self, topic: str) -> TopicSchema:
        """The topic's schema from the admin API (``/admin/v2/schemas/.../schema``), bytes when none."""
        if not self.admin_url:
            return TopicSchema()
        from ..naming import TopicName

        t = TopicName.parse(topic)
        base = t.partitioned_base
        q = urllib.parse.quote
        try:
            rec = self._get(
                f"/admin/v2/schemas/{q(base.tenant)}/{q(base.namespace)}/{q(base.local_name, safe='')}/schema"
            )
        except TopicNotFound:
            return TopicSchema()
        return TopicSchema.from_record(rec)


def refused(service_url: str, what: str, error: BaseException) -> str:
    """One line for a client call the broker refused or never answered. A refused token is retried
    by the client until its operation timeout, so a timeout usually means wrong credentials."""
    return (
        f"broker {service_url}: {what} failed: {type(error).__name__} {error}".rstrip()
        + " (check service.url and the pulsar.client.authPluginClassName/authParams/tls* options)"
    )


def _position(text) -> tuple | None:
    if not text or not isinstance(text, str) or ":" not in text:
        return None
    a, b = text.split(":", 1)
    try:
        pos = (int(a), int(b))
    except ValueError:
        return None
    return pos if pos[0] >= 0 and pos[1] >= 0 else None


def read_split(split: Split, service_url: str, client_options: dict) -> Iterator[Message]:
    """Messages of a split read with a reader (executor side)."""
    import pulsar

    client = open_client(service_url, client_options)
    try:
        compacted = split.view != "raw" and split.kind in ("compacted", "view")
        if split.kind == "live":
            start = pulsar.MessageId(split.partition, split.ledger_id, split.lo, -1)
            stop = (split.ledger_id, split.hi + 1, -1)
        elif split.kind == "compacted":
            start = (
                pulsar.MessageId.earliest
                if split.ledger_id < 0
                else pulsar.MessageId(split.partition, split.ledger_id, split.lo, -1)
            )
            stop = (split.next_ledger, 0, -1) if split.next_ledger is not None else split.end_id
        else:  # a whole view
            start = pulsar.MessageId.earliest
            stop = split.end_id
        reader = client.create_reader(
            split.topic,
            start,
            start_message_id_inclusive=True,
            is_read_compacted=compacted,
            receiver_queue_size=2000,
        )
        try:
            while reader.has_message_available():
                msg = reader.read_next(READ_TIMEOUT_MS * 15)
                mid = msg.message_id()
                ident = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                if ident >= stop:
                    break
                key = msg.partition_key() or None
                yield Message(
                    key,
                    msg.data(),
                    ident[0],
                    ident[1],
                    ident[2],
                    0,
                    msg.publish_timestamp(),
                    msg.event_timestamp(),
                    dict(msg.properties()),
                    split.partition,
                )
        finally:
            reader.close()
    finally:
        client.close()
