"""Topic lookup: which broker URL a client should connect to for a topic, over the binary
protocol (LOOKUP) and over HTTP (``GET /lookup/v2/topic/...``, answered by the admin adapter).

On one broker a lookup always answers this broker; in a cluster (``broker.cluster``) it answers
the owner of the topic's bundle, or where the bundle's assignment goes on (a Redirect). What also
varies is *which of the addresses*. Pulsar's settings, with Pulsar's rules:

* ``advertisedAddress``: the host put in lookup answers (default: the bind address).
* ``advertisedListeners``: named address sets, ``name:pulsar://host:port,name:pulsar+ssl://...``
  (also ``http://``/``https://`` entries), for clients that reach the broker through different
  networks. A client names the one it wants (``listener_name`` in the official client: the
  LOOKUP's ``advertised_listener_name``, or ``listenerName`` / ``X-Pulsar-ListenerName`` over
  HTTP); a name the broker does not have is refused with Pulsar's message "the broker do not
  have NAME listener" and MetadataError (older Pulsar brokers answered ServiceNotReady; the
  official client retries both until its operation timeout, then reports a timeout).
* ``internalListenerName``: the listener answered when the client names none (default: the
  first one listed). ``advertisedListeners`` and ``advertisedAddress`` must not both be set.

A lookup also checks the topic's name and that its namespace exists (``namespaces``), so an
unknown tenant or namespace fails at lookup as on Pulsar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

from ..errors import CompactMQError, InvalidConfiguration, ServerError
from ..naming import TopicName
from .cluster import joined_cluster
from .namespaces import check_namespace

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

_SCHEMES = {
    "pulsar": "broker_url",
    "pulsar+ssl": "broker_url_tls",
    "http": "http_url",
    "https": "http_url_tls",
}


class ListenerNotFound(CompactMQError):
    """The client asked for an advertised listener this broker does not have."""

    server_error = ServerError.MetadataError
    http_status = 404


@dataclass(frozen=True)
class Listener:
    name: str
    broker_url: str = ""
    broker_url_tls: str = ""
    http_url: str = ""
    http_url_tls: str = ""


@dataclass
class Listeners:
    """The addresses a lookup may answer: the named listeners and the default one."""

    default: Listener
    named: dict[str, Listener] = field(default_factory=dict)

    def select(self, name: str | None) -> Listener:
        """The listener called ``name`` (None or "": the default); ``ListenerNotFound`` else."""
        if not name:
            return self.default
        found = self.named.get(name)
        if found is None:
            raise ListenerNotFound(f"the broker do not have {name} listener")
        return found


def parse_advertised_listeners(text: str) -> dict[str, Listener]:
    """``name:scheme://host:port,...`` -> {name: Listener}; ``InvalidConfiguration`` when an
    entry is malformed or a listener names the same scheme twice."""
    urls: dict[str, dict[str, str]] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, url = item.partition(":")
        name = name.strip()
        parts = urlsplit(url.strip()) if sep else None
        if (
            not name
            or parts is None
            or parts.scheme not in _SCHEMES
            or not parts.hostname
            or parts.port is None
        ):
            raise InvalidConfiguration(
                f"advertisedListeners: {item!r} is not name:pulsar://host:port "
                "(schemes: pulsar, pulsar+ssl, http, https)"
            )
        slot = _SCHEMES[parts.scheme]
        mine = urls.setdefault(name, {})
        if slot in mine:
            raise InvalidConfiguration(
                f"advertisedListeners: listener {name!r} has two {parts.scheme}:// addresses"
            )
        mine[slot] = url.strip()
    out = {}
    for name, mine in urls.items():
        if "broker_url" not in mine and "broker_url_tls" not in mine:
            raise InvalidConfiguration(
                f"advertisedListeners: listener {name!r} has no pulsar:// or pulsar+ssl:// address"
            )
        out[name] = Listener(name, **mine)
    return out


def listeners_from_config(
    config: Mapping[str, Any],
    broker_url: str,
    web_url: str | None,
    broker_url_tls: str | None = None,
    web_url_tls: str | None = None,
) -> Listeners:
    """The listeners of a broker whose own addresses are ``broker_url`` / ``web_url`` (and their TLS
    twins while the TLS ports are on)."""
    text = (config.get("advertisedListeners") or "").strip()
    internal = (config.get("internalListenerName") or "").strip()
    own = Listener("", broker_url, broker_url_tls or "", web_url or "", web_url_tls or "")
    if not text:
        if internal:
            raise InvalidConfiguration("internalListenerName is set but advertisedListeners is empty")
        return Listeners(own)
    if (config.get("advertisedAddress") or "").strip():
        raise InvalidConfiguration("advertisedListeners and advertisedAddress must not be set together")
    named = parse_advertised_listeners(text)
    if internal and internal not in named:
        raise InvalidConfiguration(
            f"internalListenerName {internal!r} is not one of advertisedListeners ({', '.join(named)})"
        )
    default = named[internal or next(iter(named))]
    if not default.http_url:  # the web port is not part of a listener unless it says so
        default = Listener(
            default.name, default.broker_url, default.broker_url_tls, own.http_url, own.http_url_tls
        )
    return Listeners(default, named)


@dataclass(frozen=True)
class LookupAnswer:
    broker_url: str
    broker_url_tls: str
    http_url: str
    http_url_tls: str
    #: Pulsar's LookupType.Redirect (the client looks up again at these URLs) rather than Connect
    redirect: bool = False
    authoritative: bool = True

    def as_lookup_data(self) -> dict[str, str]:
        """Pulsar's ``LookupData`` JSON (the HTTP lookup's body)."""
        return {
            "brokerUrl": self.broker_url,
            "brokerUrlTls": self.broker_url_tls,
            "httpUrl": self.http_url,
            "httpUrlTls": self.http_url_tls,
            "nativeUrl": self.broker_url,
        }


async def lookup_topic(
    service: "BrokerService", topic: str, listener_name: str | None, authoritative: bool = False
) -> LookupAnswer:
    """Where ``topic`` is served, through the listener ``listener_name`` (None: the default).

    On one broker: this broker. In a cluster (``service.cluster``): the bundle's owner, or where
    its assignment continues (``cluster.service``); ``authoritative`` is the request's flag.

    ``InvalidTopicName``, ``NamespaceNotFound`` (TopicNotFound) or ``ListenerNotFound``.
    """
    tn = TopicName.parse(topic)
    cluster = await joined_cluster(service)  # a broker not in its cluster yet waits for the join
    if cluster is not None:  # the namespace check too is tried again while the store is away
        return await cluster.lookup(tn, listener_name, authoritative, lambda: check_namespace(service, tn))
    await check_namespace(service, tn)
    return own_answer(service, listener_name)


def own_answer(service: "BrokerService", listener_name: str | None) -> LookupAnswer:
    """This broker's URLs through the listener ``listener_name``."""
    # the advertised listeners, once BrokerServer.start bound the ports (the URLs alone before)
    listeners = service.listeners or Listeners(
        Listener(
            "",
            service.broker_url,
            service.broker_url_tls or "",
            service.web_url or "",
            service.web_url_tls or "",
        )
    )
    chosen = listeners.select(listener_name)
    http_url = chosen.http_url or listeners.default.http_url or (service.web_url or "")
    return LookupAnswer(chosen.broker_url, chosen.broker_url_tls, http_url, chosen.http_url_tls)


def answer_from_data(
    data: Mapping[str, Any], listener_name: str | None, redirect: bool, authoritative: bool
) -> LookupAnswer:
    """Another broker's URLs, from its ``NamespaceEphemeralData`` (``nativeUrl``...) or its
    ``LocalBrokerData`` (``pulsarServiceUrl``...), through the listener ``listener_name``."""
    broker_url = str(data.get("nativeUrl") or data.get("pulsarServiceUrl") or "")
    broker_url_tls = str(data.get("nativeUrlTls") or data.get("pulsarServiceUrlTls") or "")
    http_url = str(data.get("httpUrl") or data.get("webServiceUrl") or "")
    http_url_tls = str(data.get("httpUrlTls") or data.get("webServiceUrlTls") or "")
    if listener_name:
        named = (data.get("advertisedListeners") or {}).get(listener_name)
        if not isinstance(named, Mapping):
            raise ListenerNotFound(f"the broker do not have {listener_name} listener")
        broker_url = str(named.get("brokerServiceUrl") or "")
        broker_url_tls = str(named.get("brokerServiceUrlTls") or "")
    return LookupAnswer(broker_url, broker_url_tls, http_url, http_url_tls, redirect, authoritative)
