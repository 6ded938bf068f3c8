"""The Python client's own CI setup, run as upstream runs it, against a compactmq standalone.

``apache/pulsar-client-python`` starts Pulsar with ``tests/test-conf/standalone-ssl.conf``
(``build-support/start-test-service-inside-container.sh``): TLS on both ports, the TLS, token
and basic providers, authorization, ``anonymousUserRole=anonymous``,
``acknowledgmentAtBatchIndexLevelEnabled=true``. Then, as the ``superUser`` token, it PUTs the
``standalone`` cluster, the ``public`` tenant (``anonymous`` admin), ``public/default`` and
``public/default-2`` granting ``anonymous`` produce and consume in the body, the ``private``
tenant and ``private/auth`` granting ``token-principal``.

``UpstreamCi`` does the same in a PULSAR_HOME-like directory: ``test-conf/`` holds the file (a
copy of the upstream one under ``data/``), certificates the test makes under the names the file
uses, and an htpasswd with upstream's ``admin``/``123456``; the secret key sits where upstream's
does relative to the home, and ``tokenSecretKey`` -- the one absolute path in the file -- is
rewritten to it. Fixed ports and the ``0.0.0.0`` bind come from the standalone's flags.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from broker.conftest import free_port  # tests/ is on sys.path
from harness.broker import StandaloneInHome
from security.adminhttp import HttpAs
from security.helpers import APR1, file_url, make_pki, mint_token, secret_key, write_htpasswd


DATA = Path(__file__).parent / "data"
BASIC_USER, BASIC_PASSWORD = "admin", "123456"  # upstream's .htpasswd


class UpstreamCi(StandaloneInHome):
    def __init__(self, home: Path) -> None:
        self.home = home
        conf_dir = home / "test-conf"
        conf_dir.mkdir(parents=True)
        self.pki = make_pki(home / "pki")
        shutil.copy(self.pki.server.cert, conf_dir / "broker-cert.pem")
        shutil.copy(self.pki.server.key, conf_dir / "broker-key.pem")
        shutil.copy(self.pki.ca.cert_path, conf_dir / "cacert.pem")
        client = self.pki.client("superUser")
        shutil.copy(client.cert, conf_dir / "client-cert.pem")
        shutil.copy(client.key, conf_dir / "client-key.pem")
        write_htpasswd(conf_dir / ".htpasswd", {BASIC_USER: BASIC_PASSWORD}, scheme=APR1)
        tokens = home / "data" / "tokens"
        tokens.mkdir(parents=True)
        self.secret = secret_key()
        (tokens / "secret.key").write_bytes(self.secret)
        upstream = (DATA / "client-python-standalone-ssl.conf").read_text()
        rewritten = upstream.replace("file:///pulsar/data/tokens/secret.key", file_url(tokens / "secret.key"))
        assert rewritten != upstream
        (conf_dir / "standalone-ssl.conf").write_text(rewritten)
        self.ports = {
            name: free_port()
            for name in ("--broker-port", "--web-port", "--broker-port-tls", "--web-port-tls")
        }
        self.log_path = home / "standalone.log"

    # --- the broker ----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "compactmq.cli.main",
            "standalone",
            "--config",
            "test-conf/standalone-ssl.conf",
        ]
        cmd += ["--bind", "127.0.0.1", "--config-override", "compactionSparkWarmup=false"]
        for flag, port in self.ports.items():
            cmd += [flag, str(port)]
        self.launch(cmd, {"PULSAR_EXTRA_OPTS": "-Dpulsar.auth.basic.conf=test-conf/.htpasswd"}, timeout)

    # --- what the CI script and the tests use ---------------------------------------------------

    def token(self, role: str) -> str:
        return mint_token(role, self.secret)

    def admin(self, role: str | None = "superUser") -> HttpAs:
        headers = {"Authorization": f"Bearer {self.token(role)}"} if role else {}
        return HttpAs(self.web_url, headers)

    @property
    def service_url(self) -> str:
        return f"pulsar://localhost:{self.ports['--broker-port']}"

    @property
    def service_url_tls(self) -> str:
        return f"pulsar+ssl://localhost:{self.ports['--broker-port-tls']}"

    @property
    def web_url(self) -> str:
        return f"http://localhost:{self.ports['--web-port']}"

    @property
    def ca(self) -> str:
        return str(self.home / "test-conf" / "cacert.pem")

    def run_setup_script(self) -> dict[str, int]:
        """The PUTs of upstream's start-test-service-inside-container.sh, as the superUser token;
        the HTTP status of each (the script goes on whatever they answer)."""
        admin = self.admin()
        allow_anonymous = {
            "auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume"]}},
            "replication_clusters": ["standalone"],
        }
        steps = [
            (
                "clusters/standalone",
                {
                    "serviceUrl": self.web_url + "/",
                    "brokerServiceUrl": self.service_url + "/",
                    "brokerServiceUrlTls": self.service_url_tls + "/",
                },
            ),
            ("tenants/public", {"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]}),
            ("namespaces/public/default", allow_anonymous),
            ("namespaces/public/default-2", allow_anonymous),
            ("tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]}),
            (
                "namespaces/private/auth",
                {
                    "auth_policies": {"namespace_auth": {"token-principal": ["produce", "consume"]}},
                    "replication_clusters": ["standalone"],
                },
            ),
        ]
        return {
            path: admin.call("PUT", f"/admin/v2/{path}", json.loads(json.dumps(body)))[0]
            for path, body in steps
        }


@pytest.fixture(scope="module")
def upstream_ci(tmp_path_factory):
    """The standalone started with upstream's standalone-ssl.conf, before the setup script."""
    ci = UpstreamCi(tmp_path_factory.mktemp("pulsar-home"))
    ci.start()
    yield ci
    ci.stop()
