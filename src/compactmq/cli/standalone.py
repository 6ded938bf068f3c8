"""``compactmq standalone``: the broker with embedded defaults on one machine.

Configuration comes from ``compactmq.config.load_config`` (defaults < ``--config FILE`` <
``--config-override KEY=VALUE``); the dedicated flags (--data-dir, --bind, --broker-port,
--web-port, --broker-port-tls, --web-port-tls) are overrides too, applied last. A bad value of a
known key is a one-line error before anything starts; keys compactmq does not know are listed
once, on one warning line (with a "did you mean" for near misses), and the broker starts. The broker binds 127.0.0.1 unless told otherwise, prints one ready line
with its URLs (``pulsar+ssl://`` and ``https://`` too when TLS ports are set), uses uvloop when it is installed, and shuts down in order on SIGINT/SIGTERM.
``build_server`` is where the broker is put together: it builds every collaborator the broker is
given (TLS context, authentication, storage, the adapters' web service and post-compaction hooks)
-- the one place adapters are wired into the broker; the test harness starts brokers through it.
After the ready line, with ``compactionSparkWarmup`` (the default), the compaction factory warms
its engine in the background (``compaction.jobs.warmup``: the first compaction then finds Spark
started and warm).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config, describe_unknown_keys, load_config, parse_override
from ..storage.modes import PRIVATE_UMASK

if TYPE_CHECKING:
    from ..broker.server import BrokerServer


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "standalone",
        help="run the broker (binary protocol and web service) with embedded defaults",
        description="Run a standalone compactmq broker: files under the data directory, SQLite "
        "metadata, Spark in local mode started when first needed.",
    )
    p.add_argument("--data-dir", help="directory for ledgers and metadata (config key dataDir)")
    p.add_argument("--bind", help="address to listen on (default 127.0.0.1; bindAddress)")
    p.add_argument("--broker-port", type=int, help="Pulsar binary protocol port (default 6650)")
    p.add_argument("--web-port", type=int, help="admin REST API and /metrics port (default 8080)")
    p.add_argument(
        "--broker-port-tls",
        type=int,
        help="binary protocol over TLS, pulsar+ssl:// (brokerServicePortTls; default off)",
    )
    p.add_argument(
        "--web-port-tls", type=int, help="admin REST API over HTTPS (webServicePortTls; default off)"
    )
    p.add_argument("--config", metavar="FILE", help="broker.conf-style file of key=value lines")
    p.add_argument(
        "--config-override",
        metavar="KEY=VALUE",
        action="extend",
        nargs="+",
        default=[],
        help="override config keys (several after one flag, or the flag repeated), "
        "e.g. keepAliveIntervalSeconds=10 allowAutoTopicCreation=false",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.add_argument(
        "--debug-log",
        metavar="LOGGER",
        action="append",
        default=[],
        help="a logger of compactmq's to log at DEBUG whatever --log-level says (repeatable), "
        "e.g. compactmq.storage.object_deletes",
    )
    p.set_defaults(func=run)


_LOGGER_NAME = re.compile(r"compactmq(\.[A-Za-z_][A-Za-z0-9_]*)*")


def build_config(args: argparse.Namespace):
    overrides: dict[str, str] = {}
    for item in args.config_override:
        key, value = parse_override(item)
        overrides[key] = value
    flags = {
        "dataDir": args.data_dir,
        "bindAddress": args.bind,
        "brokerServicePort": args.broker_port,
        "webServicePort": args.web_port,
        "brokerServicePortTls": args.broker_port_tls,
        "webServicePortTls": args.web_port_tls,
    }
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    config = build_config(args)  # InvalidConfiguration -> one line from cli.main
    # what this process and its children (SQLite, pyarrow, Spark) create is owner-only
    os.umask(PRIVATE_UMASK)
    logging.basicConfig(
        # the operator's --log-level name, looked up among logging's levels (INFO for anything else)
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name in args.debug_log:
        # only compactmq's own loggers (a dotted name under it): nothing else is asked for
        if not _LOGGER_NAME.fullmatch(name):
            raise SystemExit(f"--debug-log: not a compactmq logger name: {name!r}")
        logging.getLogger(name).setLevel(logging.DEBUG)
    ignored = config.ignored_keys
    if ignored:  # a Pulsar broker.conf/standalone.conf: keys of parts compactmq does not have
        logging.getLogger(__name__).warning(
            "ignoring %d Pulsar config keys compactmq has no part for: %s", len(ignored), ", ".join(ignored)
        )
    unknown = config.unknown_keys
    if unknown:  # neither ours nor Pulsar's: a newer release's key, or a typo (then a suggestion)
        logging.getLogger(__name__).warning(
            "ignoring %d unknown config keys: %s", len(unknown), describe_unknown_keys(unknown)
        )
    from ..broker import malloc_policy

    malloc_policy.apply()  # few malloc arenas, set before any thread starts (see malloc_policy)
    runner: Callable[..., Any] = asyncio.run
    try:
        import uvloop  # optional: the "fast" extra

        runner = uvloop.run
    except ImportError:
        pass
    return runner(_serve(config)) or 0


async def build_server(config: Config) -> BrokerServer:
    """The broker and every collaborator it is given, built here (the one place that wires the
    adapters into the broker, as the layers want): the TLS context and the authentication
    (bad settings or key files are a one-line error before storage opens), the storage with the
    default namespace, the ``BrokerService``, and the ``BrokerServer`` with the web service. The
    server is not started; it owns the storage from here on (a failed start closes it)."""
    from ..admin.server import start as start_web  # the web adapter, wired in here (layers)
    from ..auth import AuthenticationService, tls
    from ..broker.default_namespace import ensure_default_namespace
    from ..broker.server import BrokerServer, BrokerService, check_ports
    from ..spark.auto_export import export_after_compaction  # the compactedExport policy (adapter)
    from ..storage import Storage

    ssl_context = tls.server_context(config)
    check_ports(config)
    authentication = AuthenticationService.from_config(config)
    loop = asyncio.get_running_loop()
    # public/default is created below, as a Pulsar standalone creates it
    opener = functools.partial(Storage, config.data_dir, config, bootstrap_defaults=False)
    storage = await loop.run_in_executor(None, opener)
    try:
        await loop.run_in_executor(None, ensure_default_namespace, storage.resources, config, authentication)
        service = BrokerService(
            config,
            storage,
            authentication=authentication,
            post_compaction_hooks=(export_after_compaction,),
        )
    except BaseException:
        await loop.run_in_executor(None, storage.close)
        raise
    return BrokerServer(service, ssl_context=ssl_context, web_service=start_web)


async def _serve(config: Config) -> int:
    from ..broker import gc_policy

    server = await build_server(config)
    await server.start()
    gc_policy.apply()  # the startup heap frozen, a larger young generation (see gc_policy)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker_url, web_url = server.urls
    broker_tls, web_tls = server.tls_urls
    tls_part = (f" broker-tls {broker_tls}" if broker_tls else "") + (
        f" web-tls {web_tls}" if web_tls else ""
    )
    print(
        f"compactmq standalone ready: broker {broker_url or 'off'} web {web_url or 'off'}{tls_part} "
        f"data {config.data_dir}",
        flush=True,
    )
    if config["compactionSparkWarmup"]:
        _start_warmup(server)
    await stop.wait()
    print("compactmq standalone: shutting down", file=sys.stderr, flush=True)
    await server.shutdown()
    return 0


def _start_warmup(server: BrokerServer) -> None:
    """``compactionSparkWarmup``: have the compaction factory warm its engine in the background
    (the Spark one starts its session and runs a scratch compaction), after the ready line, so
    readiness never waits for it; a factory that cannot load is the first run's error, not this."""
    try:
        server.service.compaction_monitor.factory().warm_up()
    except Exception as e:  # noqa: BLE001 - the broker runs on; the first run reports the problem
        logging.getLogger(__name__).warning("compaction warm-up not started: %s", e)
