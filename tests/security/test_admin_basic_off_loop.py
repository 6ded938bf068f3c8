"""The admin web app checks passwords off its event loop (issue 9): bcrypt is slow on purpose, so
``Basic`` requests must not stall token requests, nor each other.

The app runs in process (aiohttp's test server on a real socket) with the real token and basic
providers; the basic provider is wrapped by a *gate* that holds every password check until the
test releases it. While checks are provably running (started, not released), a token request
must complete: were the check on the loop, the loop would be blocked in the gate and the token
request could not be answered (the test then fails on its timeout, not on a timing guess).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from concurrent.futures import ThreadPoolExecutor

import bcrypt
from aiohttp.test_utils import TestClient, TestServer

from compactmq.admin.app import OPENAPI_PATH, build_app
from compactmq.auth import AuthenticationService
from compactmq.auth.authorization import AuthorizationService
from compactmq.auth.basic import BasicAuthenticationProvider
from compactmq.auth.token_provider import TokenAuthenticationProvider
from compactmq.config import load_config

from .helpers import mint_token, secret_key

PASSWORD = "slow-but-right"
GATE_TIMEOUT = 60.0  # a gate never released (a broken test) ends, it does not hang the suite


class GatedBasicProvider(BasicAuthenticationProvider):
    """The real basic provider; each check announces itself and waits for the test's release."""

    def __init__(self, users):
        super().__init__(users)
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.on_loop = 0

    def authenticate(self, data, peer_cert=None):
        try:
            asyncio.get_running_loop()
            self.on_loop += 1  # called from a thread running an event loop: the loop is blocked
        except RuntimeError:
            pass
        self.started.release()
        self.release.wait(GATE_TIMEOUT)
        return super().authenticate(data, peer_cert)


class Service:
    """What ``build_app`` needs of a broker for these paths: a config and the authentication."""

    cluster_name = "standalone"

    def __init__(self, config, authentication):
        self.config = config
        self.authentication = authentication
        self.authorization = AuthorizationService(config, None)  # authorizationEnabled off: no checks
        self.executor = ThreadPoolExecutor(2)

    def run_blocking(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def basic_header(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_password_checks_do_not_stall_token_requests(tmp_path):
    # a cost-12 bcrypt entry, as an operator's htpasswd -B -C 12 writes it
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=12)).decode().replace("$2b$", "$2y$", 1)
    basic = GatedBasicProvider({"ops": hashed})
    key = secret_key()
    authentication = AuthenticationService(
        {
            "token": TokenAuthenticationProvider(key, algorithms=("HS256",)),
            "basic": basic,
        }
    )
    service = Service(load_config(overrides={"dataDir": str(tmp_path / "data")}), authentication)
    token = {"Authorization": "Bearer " + mint_token("admin", key)}
    storm = 3  # wrong passwords, in flight together with the right one

    async def run():
        loop = asyncio.get_running_loop()
        async with TestClient(TestServer(build_app(service))) as client:
            wrong = [
                asyncio.create_task(client.get(OPENAPI_PATH, headers=basic_header("ops", f"guess-{i}")))
                for i in range(storm)
            ]
            right = asyncio.create_task(client.get(OPENAPI_PATH, headers=basic_header("ops", PASSWORD)))
            for _ in range(storm + 1):  # every password check has started and is held in the gate
                assert await loop.run_in_executor(None, basic.started.acquire, True, GATE_TIMEOUT)
            resp = await asyncio.wait_for(client.get(OPENAPI_PATH, headers=token), GATE_TIMEOUT / 2)
            assert resp.status == 200, await resp.text()
            assert not any(t.done() for t in [*wrong, right])  # the password checks are still running
            basic.release.set()
            wrong_status = [(await t).status for t in wrong]
            right_status = (await right).status
            return wrong_status, right_status

    try:
        wrong_status, right_status = asyncio.run(run())
    finally:
        basic.release.set()
        service.executor.shutdown()
    assert basic.on_loop == 0
    assert wrong_status == [401] * storm
    assert right_status == 200
