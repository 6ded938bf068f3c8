"""Who is on a connection and what it may do: the broker's side of authentication and
authorization. The decisions live in ``compactmq.auth``; this module only asks at the right
moments and puts the answers on the wire.

**CONNECT.** The client names its method (``auth_method_name``: ``token``, ``basic``, ``tls``,
``none``) and sends its credential (``auth_data``); over TLS the verified client certificate
comes from the transport. ``AuthenticationService.authenticate_connect`` turns them into a
``Principal`` (role, method, expiry) or raises ``AuthenticationFailed``: the broker answers
ERROR ``AuthenticationError`` (request id -1, as Pulsar) and closes the connection. The role
stays with the connection; nothing is checked per message after that. Tokens and
certificates take microseconds and are checked on the event loop; a password hash is slow on
purpose (``compactmq.auth.SLOW_METHODS``), so ``basic`` is checked on a thread
(``compactmq.auth.off_loop``, as the admin's HTTP requests are) while the connection's later
input waits.

**Refresh.** A credential can expire while its connection lives (a token's ``exp``). Every
``authenticationRefreshCheckSeconds`` the ``CredentialRefresher`` looks at each connection
whose credential has an expiry. An expired one is sent AUTH_CHALLENGE (challenge data
``refresh``) when its client announced ``supports_auth_refresh`` in CONNECT, and closed
otherwise. The client answers AUTH_RESPONSE with its current credential (the official client
asks its token supplier again); a valid credential for the *same* role replaces the old one
(a changed role or an invalid credential closes the connection, as in Pulsar). A challenge
still unanswered at the next check closes the connection.

**Authorization.** Before a command acts on a topic the handler asks
``AuthorizationService.check_*`` (SQLite behind it, so through ``run_blocking``): PRODUCER and
GET_OR_CREATE_SCHEMA need ``produce``; SUBSCRIBE (consumers, readers, TableView) needs
``consume`` on a subscription not reserved for other roles (``subscription_auth_roles``); LOOKUP, PARTITIONED_METADATA, GET_SCHEMA and GET_TOPICS_OF_NAMESPACE need what
a lookup needs (produce or consume). A refusal is ``AuthorizationFailed``, answered by the
command's own error boundary with ``AuthorizationError``. With ``authorizationEnabled=false``
no check runs and no thread is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..auth import SLOW_METHODS, Principal, off_loop, tls
from ..errors import AuthenticationFailed, ServerError
from ..naming import TopicName
from ..protocol import commands
from ..protocol import pulsar_pb2 as pb
from .namespaces import NamespaceNotFound

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection
    from .server import BrokerService

log = logging.getLogger(__name__)

T = pb.BaseCommand
# The connection-level ERROR of a refused CONNECT carries no request: Pulsar sends -1.
NO_REQUEST_ID = commands.to_unsigned64(-1)
# The principal of connections to a broker without authentication.
UNAUTHENTICATED = Principal(None, "none", None)


def _peer_certificate(conn: ServerConnection) -> dict | None:
    return tls.peer_certificate(conn.transport)


def connect(conn: ServerConnection, cmd: pb.CommandConnect, accept: Callable[[Principal], None]) -> None:
    """Authenticate a CONNECT: ``accept(principal)`` answers CONNECTED; a failure is refused
    here (ERROR AuthenticationError, close). Tokens and certificates are checked at once;
    passwords off the event loop (see ``SLOW_METHODS``), the connection's input held meanwhile."""
    authentication = conn.service.authentication
    if not authentication.enabled:
        accept(UNAUTHENTICATED)
        return
    conn.supports_auth_refresh = cmd.feature_flags.supports_auth_refresh
    method = cmd.auth_method_name or "none"
    check = functools.partial(
        authentication.authenticate_connect, method, bytes(cmd.auth_data), _peer_certificate(conn)
    )
    if method not in SLOW_METHODS:
        try:
            principal = check()
        except AuthenticationFailed as exc:
            refuse(conn, exc)
            return
        accept(principal)
        return
    conn.hold_input()  # commands behind CONNECT wait for its answer, in order
    conn.service.state.spawn(_connect_off_loop(conn, check, accept))


async def _connect_off_loop(
    conn: ServerConnection, check: Callable[[], Principal], accept: Callable[[Principal], None]
) -> None:
    try:
        principal = await off_loop(check)
    except AuthenticationFailed as exc:
        refuse(conn, exc)
        return
    except Exception as exc:
        log.exception("authentication of %s failed", conn.peer)
        refuse(conn, AuthenticationFailed(f"internal error: {type(exc).__name__}"))
        return
    if conn.closed:
        return
    accept(principal)
    conn.release_input()


def refuse(conn: ServerConnection, exc: AuthenticationFailed, request_id: int = NO_REQUEST_ID) -> None:
    """Answer ERROR AuthenticationError and close (the reason, never the credential)."""
    if conn.closed:
        return
    log.info("authentication of %s failed: %s", conn.peer, exc)
    if not conn.state.connected:
        conn.state.send(T.ERROR)  # CONNECTING -> CLOSED
    conn.send_command(commands.error(request_id, ServerError.AuthenticationError, str(exc)))
    conn.close()


def on_auth_response(conn: ServerConnection, cmd: pb.CommandAuthResponse) -> None:
    """A client's fresh credential after AUTH_CHALLENGE: keep the connection or close it."""
    authentication = conn.service.authentication
    if not authentication.enabled:
        return  # nothing was asked
    old = conn.principal or UNAUTHENTICATED
    data = cmd.response
    try:
        # same role or AuthenticationFailed (Pulsar refuses a role change on refresh)
        fresh = authentication.refresh(
            old, data.auth_method_name, bytes(data.auth_data), _peer_certificate(conn)
        )
    except AuthenticationFailed as exc:
        refuse(conn, exc)
        return
    conn.principal = fresh
    conn.auth_refresh_pending = False
    log.debug("credentials of %s refreshed", conn.peer)


class CredentialRefresher:
    """Every ``authenticationRefreshCheckSeconds``: challenge or close connections whose
    credential expired (see the module notes)."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.interval = max(1, int(service.config["authenticationRefreshCheckSeconds"]))
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        authentication = self.service.authentication
        if authentication.enabled:
            self._task = self.service.state.spawn(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.run_once()
            except Exception:  # the checks go on: a bug here must not end them all
                log.exception("credential refresh check failed")

    def run_once(self, now: float | None = None) -> None:
        authentication = self.service.authentication
        for conn in list(self.service.state.connections):
            principal = conn.principal
            if conn.closed or principal is None or principal.expires_at is None:
                continue
            if not conn.state.connected or not authentication.is_expired(principal, now):
                continue
            if conn.auth_refresh_pending:
                log.info(
                    "closing %s: its %s credentials expired and no valid refresh came back",
                    conn.peer,
                    principal.method,
                )
                conn.close()
            elif conn.supports_auth_refresh:
                conn.auth_refresh_pending = True
                conn.send_command(commands.auth_challenge(principal.method, conn.handler.protocol_version))
            else:
                log.info(
                    "closing %s: its %s credentials expired (the client cannot refresh them)",
                    conn.peer,
                    principal.method,
                )
                conn.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def authorize(conn: ServerConnection, action: str, topic: str, subscription: str | None = None) -> None:
    """Raise ``AuthorizationFailed`` unless the connection's role may ``action`` (produce,
    consume, lookup) on ``topic``; ``consume`` also honours a subscription reserved for other
    roles (the namespace's ``subscription_auth_roles``). A topic of a namespace that does not
    exist is ``NamespaceNotFound`` (TopicNotFound) first, whoever asks: Pulsar reads the
    namespace's policies to decide, and answers "Namespace not found" without them."""
    authorization = conn.service.authorization
    if not authorization.enabled:
        return
    tn = TopicName.parse(topic)  # InvalidTopicName before any lookup of grants
    name = str(tn)
    exists = await conn.service.run_blocking(
        conn.service.storage.resources.namespaces.exists, tn.namespace_name
    )
    if not exists:
        raise NamespaceNotFound(f"Namespace not found: {tn.namespace_name} (topic {tn})")
    check = {
        "produce": authorization.check_produce,
        "consume": authorization.check_consume,
        "lookup": authorization.check_lookup,
    }[action]
    role = conn.principal.role if conn.principal is not None else None
    if subscription is not None:
        await conn.service.run_blocking(check, role, name, subscription)
    else:
        await conn.service.run_blocking(check, role, name)


async def authorize_namespace(conn: ServerConnection, namespace: str) -> None:
    """GET_TOPICS_OF_NAMESPACE: listing needs what a lookup of a topic there would need."""
    authorization = conn.service.authorization
    if not authorization.enabled:
        return
    role = conn.principal.role if conn.principal is not None else None
    await conn.service.run_blocking(authorization.check_namespace_lookup, role, namespace)
