"""What admin handlers share: the request context, body parsing, the 412 error."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..config import parse_bool
from ..errors import InvalidInput, PreconditionFailed

if TYPE_CHECKING:
    from ..auth import AuthenticationService
    from ..broker.compaction_monitor import CompactionMonitor
    from ..broker.server import BrokerService
    from .metrics import TrafficSampler

__all__ = ["Context", "PreconditionFailed", "query_flag", "read_json"]


class Context:
    """What handlers share: the broker service, its compaction monitor, the traffic sampler, and
    the authentication and authorization services the broker built (``compactmq.auth``)."""

    def __init__(self, service: BrokerService, sampler: TrafficSampler) -> None:
        self.service = service
        self.sampler = sampler

    @property
    def authentication(self) -> AuthenticationService:
        """The broker's ``AuthenticationService`` (one with ``enabled`` off when it has none)."""
        return self.service.authentication

    @property
    def authorization(self):
        """The broker's ``AuthorizationService`` (grants are stored through it even while
        ``authorizationEnabled`` is off)."""
        return self.service.authorization

    @property
    def storage(self):
        return self.service.storage

    @property
    def policies(self):
        """Namespace and topic policies (``storage.resources.PolicyResources``)."""
        return self.service.storage.policies

    @property
    def topic_metadata(self):
        """Topics, their ledger lists and cursors (``storage.resources.topic_metadata``)."""
        return self.service.storage.topic_metadata

    @property
    def resources(self):
        """The typed resources (``storage.resources.PulsarResources``): tenants and namespaces."""
        return self.service.storage.resources

    @property
    def monitor(self) -> CompactionMonitor:
        return self.service.compaction_monitor

    def run_blocking(self, fn, *args):
        return self.service.run_blocking(fn, *args)

    def compaction_stats(self, topic: str):
        """``CompactionStats`` of ``topic``'s compacted view, from its compaction service (blocking)."""
        return self.monitor.service_of(topic).stats()

    def compaction_state(self, topic: str):
        """The topic's ``CompactionState`` (status, horizon, view pointer), from its compaction
        service (blocking)."""
        return self.monitor.service_of(topic).state()

    def compaction_states(self) -> dict:
        """``{topic: CompactionState}`` of every topic with a compaction state (blocking)."""
        from ..compaction.state import states_of

        return states_of(self.storage).all()

    def compaction_lag_ms(self, ml, horizon) -> int:
        """Age (ms) of ``ml``'s oldest message after ``horizon``: 0 when all is compacted."""
        import time

        from ..compaction.lag import compaction_lag_ms

        return compaction_lag_ms(ml, horizon, int(time.time() * 1000))


async def read_json(request: web.Request, what: str) -> Any:
    """The request body as JSON; ``InvalidInput`` (400) when it is missing or not JSON."""
    raw = await request.read()
    if not raw.strip():
        raise InvalidInput(f"a request body is required: {what}")
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidInput(f"the request body is not JSON: expected {what}") from None


def query_flag(request: web.Request, name: str) -> bool:
    return parse_bool(request.query.get(name, "false"), default=False)
