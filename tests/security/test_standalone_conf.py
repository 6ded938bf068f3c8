"""A Pulsar operator's setup, unchanged: ``compactmq standalone --config conf/standalone.conf``.

The file below is written the way a Pulsar ``conf/standalone.conf`` is -- sections of broker,
metadata store, BookKeeper, load balancer, functions and transaction keys that compactmq has no
part for, next to the security keys it does implement: TLS on both ports (``brokerServicePortTls``,
``webServicePortTls``), the token (RS256 key pair made by ``compactmq tokens``), TLS and basic
providers, authorization with a superuser. Paths are relative, resolved against the directory the
broker is started from (as ``bin/pulsar standalone`` does from PULSAR_HOME); the htpasswd file is
given the way Pulsar's docs give it, ``PULSAR_EXTRA_OPTS=-Dpulsar.auth.basic.conf=...``.

The test then does what the operator does next: creates a tenant, a namespace and grants over the
HTTPS admin API with the superuser's token, and runs the official ``pulsar-client`` through each
provider -- token, TLS client certificate, basic -- over ``pulsar+ssl://``, over the HTTP lookup
path (``http://`` and ``https://`` service URLs), and checks that a role gets only what it was
granted.
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import sys
from pathlib import Path

import pytest
from broker.conftest import free_port, make_client  # tests/ is on sys.path
from harness.broker import StandaloneInHome
from harness.cli import run_cli

from .adminhttp import HttpAs
from .helpers import write_htpasswd

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

SUPERUSER = "admin"
PASSWORDS = {"app-basic": "basic-pw-1", "viewer": "viewer-pw-2"}
NS = "acme/app"
PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProvider"

# An excerpt of Pulsar's conf/standalone.conf, key names and the values Pulsar ships, with the
# security section filled in. Nothing here is specific to compactmq.
STANDALONE_CONF = """\
### --- General broker settings --- ###
metadataStoreUrl=
metadataStoreConfigPath=
configurationMetadataStoreUrl=
zookeeperServers=
configurationStoreServers=
brokerServicePort={broker_port}
brokerServicePortTls={broker_port_tls}
webServicePort={web_port}
webServicePortTls={web_port_tls}
# compactmq's tests never listen beyond loopback (Pulsar ships 0.0.0.0)
bindAddress=127.0.0.1
bindAddresses=
advertisedAddress=
haProxyProtocolEnabled=false
numIOThreads=
numOrderedExecutorThreads=8
numHttpServerThreads=
numExecutorThreadPoolSize=
numCacheExecutorThreadPoolSize=10
maxConcurrentHttpRequests=1024
clusterName=standalone
failureDomainsEnabled=false
metadataStoreSessionTimeoutMillis=30000
metadataStoreOperationTimeoutSeconds=30
metadataStoreCacheExpirySeconds=300
brokerShutdownTimeoutMs=60000
skipBrokerShutdownOnOOM=false
backlogQuotaCheckEnabled=true
backlogQuotaCheckIntervalInSeconds=60
backlogQuotaDefaultLimitGB=10
backlogQuotaDefaultLimitSecond=-1
ttlDurationDefaultInSeconds=0
brokerDeleteInactiveTopicsEnabled=true
brokerDeleteInactiveTopicsFrequencySeconds=60
forceDeleteTenantAllowed=false
forceDeleteNamespaceAllowed=false
maxPendingPublishRequestsPerConnection=1000
messageExpiryCheckIntervalInMinutes=5
activeConsumerFailoverDelayTimeMillis=1000
subscriptionExpirationTimeMinutes=0
subscriptionRedeliveryTrackerEnabled=true
subscriptionKeySharedUseConsistentHashing=true
brokerDeduplicationEnabled=false
defaultNumberOfNamespaceBundles=4
maxTopicsPerNamespace=0
isAllowAutoUpdateSchemaEnabled=true
clientLibraryVersionCheckEnabled=false
statusFilePath=/usr/local/apache/htdocs
maxUnackedMessagesPerConsumer=50000
maxUnackedMessagesPerSubscription=200000
maxUnackedMessagesPerBroker=0
maxUnackedMessagesPerSubscriptionOnBrokerBlocked=0.16
dispatchThrottlingRatePerTopicInMsg=0
dispatchThrottlingRatePerTopicInByte=0
maxConcurrentLookupRequest=50000
maxConcurrentTopicLoadRequest=5000
enablePersistentTopics=true
enableNonPersistentTopics=true
maxProducersPerTopic=0
maxConsumersPerTopic=0
maxNumPartitionsPerPartitionedTopic=0
brokerMaxConnections=0
brokerMaxConnectionsPerIp=0
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
defaultNumPartitions=1

### --- Metadata Store --- ###
metadataStoreBatchingEnabled=true
metadataStoreBatchingMaxDelayMillis=5

### --- TLS --- ###
tlsEnabled=false
tlsCertRefreshCheckDurationSec=300
tlsCertificateFilePath=conf/certs/broker.cert.pem
tlsKeyFilePath=conf/certs/broker.key-pk8.pem
tlsTrustCertsFilePath=conf/certs/ca.cert.pem
tlsAllowInsecureConnection=false
tlsRequireTrustedClientCertOnConnect=false
tlsProtocols=TLSv1.3,TLSv1.2
tlsCiphers=

### --- Authentication --- ###
authenticationEnabled=true
authenticationProviders={providers}
authenticationRefreshCheckSeconds=60
authorizationEnabled=true
authorizationProvider=org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider
authorizationAllowWildcardsMatching=false
superUserRoles={superuser}
anonymousUserRole=
authenticateMetricsEndpoint=true
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=token:{superuser_token}
brokerClientTrustCertsFilePath=conf/certs/ca.cert.pem
tokenPublicKey=file://{public_key}
tokenPublicAlg=RS256
tokenAuthClaim=
tokenAudienceClaim=
tokenAudience=
tokenAllowedClockSkewSeconds=0
saslJaasClientAllowedIds=
athenzDomainNames=

### --- BookKeeper Client --- ###
bookkeeperMetadataServiceUri=
bookkeeperClientAuthenticationPlugin=
bookkeeperClientAuthenticationParametersName=
bookkeeperClientTimeoutInSeconds=30
bookkeeperNumberOfChannelsPerBookie=16
bookkeeperClientRackawarePolicyEnabled=true
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
managedLedgerCacheSizeMB=
managedLedgerMaxEntriesPerLedger=50000
managedLedgerCursorMaxEntriesPerLedger=50000
managedLedgerCursorRolloverTimeInSeconds=14400
autoSkipNonRecoverableData=false

### --- Load balancer --- ###
loadManagerClassName=org.apache.pulsar.broker.loadbalance.impl.ModularLoadManagerImpl
loadBalancerEnabled=false
loadBalancerSheddingEnabled=true
loadBalancerReportUpdateThresholdPercentage=10

### --- Functions, schema, system topics, transactions, websocket --- ###
functionsWorkerEnabled=false
isSchemaValidationEnforced=false
schemaRegistryStorageClassName=org.apache.pulsar.broker.service.schema.BookkeeperSchemaStorageFactory
systemTopicEnabled=true
topicLevelPoliciesEnabled=true
exposeTopicLevelMetricsInPrometheus=true
exposeConsumerLevelMetricsInPrometheus=false
webSocketServiceEnabled=false
transactionCoordinatorEnabled=false
brokerEntryMetadataInterceptors=
"""


#: the official client's operation timeout where the broker refuses it: the client retries
#: until it runs out, so this is what each refusal costs; a broker that wrongly accepted
#: would answer in milliseconds, well inside it
REFUSED_TIMEOUT = 1


def compactmq(*args: str, cwd: Path) -> str:
    """The operator's ``compactmq`` command, run from ``cwd`` (in this process: ``run_cli``)."""
    with contextlib.chdir(cwd):
        proc = run_cli(*args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


class Standalone(StandaloneInHome):
    """PULSAR_HOME-like directory with conf/standalone.conf, and the broker started from it."""

    def __init__(self, home: Path, pki) -> None:
        self.home = home
        self.pki = pki
        certs = home / "conf" / "certs"
        certs.mkdir(parents=True)
        shutil.copy(pki.server.cert, certs / "broker.cert.pem")
        shutil.copy(pki.server.key, certs / "broker.key-pk8.pem")
        shutil.copy(pki.ca.cert_path, certs / "ca.cert.pem")
        write_htpasswd(home / "conf" / ".htpasswd", PASSWORDS)
        # the token keys as an operator makes them, with the token tool
        keys = home / "keys"
        keys.mkdir()
        compactmq(
            "tokens",
            "create-key-pair",
            "--output-private-key",
            "keys/my-private.key",
            "--output-public-key",
            "keys/my-public.key",
            cwd=home,
        )
        self.ports = {
            name: free_port() for name in ("broker_port", "broker_port_tls", "web_port", "web_port_tls")
        }
        self.superuser_token = self.token(SUPERUSER)
        providers = ",".join(PROVIDER + p for p in ("Token", "Tls", "Basic"))
        conf = STANDALONE_CONF.format(
            providers=providers,
            superuser=SUPERUSER,
            superuser_token=self.superuser_token,
            public_key=keys / "my-public.key",
            **self.ports,
        )
        (home / "conf" / "standalone.conf").write_text(conf)
        self.log_path = home / "standalone.log"

    def token(self, role: str) -> str:
        return compactmq(
            "tokens",
            "create",
            "--private-key",
            f"file://{self.home}/keys/my-private.key",
            "--subject",
            role,
            cwd=self.home,
        ).strip()

    def start(self, timeout: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "compactmq.cli.main", "standalone", "--config", "conf/standalone.conf"]
        self.launch(cmd, {"PULSAR_EXTRA_OPTS": "-Xmx1g -Dpulsar.auth.basic.conf=conf/.htpasswd"}, timeout)

    # --- how to reach it ---------------------------------------------------------------------

    @property
    def ca(self) -> str:
        return str(self.pki.ca.cert_path)

    def https(self, headers: dict[str, str] | None = None, cert=None) -> HttpAs:
        ctx = ssl.create_default_context(cafile=self.ca)
        if cert is not None:
            ctx.load_cert_chain(str(cert.cert), str(cert.key))
        return HttpAs(f"https://127.0.0.1:{self.ports['web_port_tls']}", headers or {}, ctx)

    def http(self, headers: dict[str, str] | None = None) -> HttpAs:
        return HttpAs(f"http://127.0.0.1:{self.ports['web_port']}", headers or {})

    def bearer(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def client(self, url: str, authentication=None, **kw) -> pulsar.Client:
        if url.startswith(("pulsar+ssl", "https")):
            kw.setdefault("tls_trust_certs_file_path", self.ca)
        kw.setdefault("operation_timeout_seconds", 15)
        return make_client(url, authentication=authentication, **kw)

    @property
    def pulsar_ssl(self) -> str:
        return f"pulsar+ssl://localhost:{self.ports['broker_port_tls']}"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, pki):
    s = Standalone(tmp_path_factory.mktemp("pulsar-home"), pki)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(standalone):
    return {role: standalone.token(role) for role in ("app-token", "acme-admin", "stranger")}


@pytest.fixture(scope="module")
def tenant(standalone, tokens):
    """The operator's setup over the HTTPS admin API, as the superuser (token)."""
    admin = standalone.https(standalone.bearer(standalone.superuser_token))
    admin.ok(
        "PUT", "/admin/v2/tenants/acme", {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
    )
    # the creation body's auth_policies.namespace_auth is a grant too (Pulsar's Policies object)
    admin.ok(
        "PUT",
        f"/admin/v2/namespaces/{NS}",
        {"auth_policies": {"namespace_auth": {"app-token": ["produce", "consume"]}}},
    )
    for role, actions in (
        ("app-cert", ["produce", "consume"]),
        ("app-basic", ["consume", "produce"]),
        ("viewer", ["consume"]),
    ):
        admin.ok("POST", f"/admin/v2/namespaces/{NS}/permissions/{role}", actions)
    return admin


def round_trip(client: pulsar.Client, topic: str, n: int = 3) -> None:
    """Subscribe, produce n messages, consume them all: the provider got the client in."""
    try:
        consumer = client.subscribe(topic, "ops", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent = [f"{topic}-{i}".encode() for i in range(n)]
        for payload in sent:
            producer.send(payload)
        got = []
        for _ in sent:
            msg = consumer.receive(15_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        assert got == sent
    finally:
        client.close()


# --- the file itself ------------------------------------------------------------------------------


def test_started_from_the_unmodified_file(standalone):
    ports = standalone.ports
    line = standalone.ready_line
    assert f"pulsar://127.0.0.1:{ports['broker_port']}" in line
    assert f"pulsar+ssl://127.0.0.1:{ports['broker_port_tls']}" in line
    assert f"https://127.0.0.1:{ports['web_port_tls']}" in line
    assert (standalone.home / "data").is_dir()  # dataDir's default, relative to where it started
    log = standalone.log_path.read_text()
    ignored = [entry for entry in log.splitlines() if "ignoring" in entry and "Pulsar config keys" in entry]
    assert len(ignored) == 1, ignored  # listed once, on one line
    for key in (
        "zookeeperServers",
        "metadataStoreConfigPath",
        "bookkeeperClientTimeoutInSeconds",
        "loadBalancerReportUpdateThresholdPercentage",
        "functionsWorkerEnabled",
        "brokerClientTrustCertsFilePath",
    ):
        assert key in ignored[0], key
    implemented = (
        "authenticationEnabled",
        "tlsCertificateFilePath",
        "superUserRoles",
        "brokerServicePortTls",
    )
    cluster_keys = ("clusterName", "loadBalancerEnabled", "defaultNumberOfNamespaceBundles")
    for key in implemented + ("metadataStoreUrl", "metadataStoreSessionTimeoutMillis") + cluster_keys:
        assert f" {key}," not in ignored[0] and not ignored[0].endswith(key), key  # implemented keys act
    assert standalone.superuser_token not in log  # a secret of an ignored key is never logged


def test_admin_api_needs_the_superuser_for_tenants(standalone, tenant, tokens):
    assert "acme" in tenant.ok("GET", "/admin/v2/tenants")
    assert tenant.ok("GET", f"/admin/v2/namespaces/{NS}/permissions") == {
        "app-basic": ["consume", "produce"],
        "app-cert": ["consume", "produce"],
        "app-token": ["consume", "produce"],
        "viewer": ["consume"],
    }
    assert standalone.https().call("GET", "/admin/v2/tenants")[0] == 401
    assert standalone.http(standalone.bearer(tokens["acme-admin"])).call("GET", "/admin/v2/tenants")[0] == 403
    # the tenant admin runs its own namespace: list and grant, over plain HTTP with its token
    acme_admin = standalone.http(standalone.bearer(tokens["acme-admin"]))
    assert NS in acme_admin.ok("GET", "/admin/v2/namespaces/acme")
    # the superuser's TLS client certificate is a credential too (CN = role)
    as_cert = standalone.https(cert=standalone.pki.client(SUPERUSER))
    assert "acme" in as_cert.ok("GET", "/admin/v2/tenants")


def test_metrics_need_credentials_when_the_file_says_so(standalone, tenant):
    status, body, _ = standalone.http().call("GET", "/metrics")
    assert status == 401 and body["reason"]
    status, text, _ = standalone.http(standalone.bearer(standalone.superuser_token)).call("GET", "/metrics")
    assert status == 200 and "pulsar_" in text


# --- the official client through each provider ------------------------------------------------------


def test_token_over_tls(standalone, tenant, tokens):
    round_trip(
        standalone.client(standalone.pulsar_ssl, pulsar.AuthenticationToken(tokens["app-token"])),
        f"persistent://{NS}/token-tls",
    )


def test_tls_client_certificate(standalone, tenant):
    cert = standalone.pki.client("app-cert")
    round_trip(
        standalone.client(standalone.pulsar_ssl, pulsar.AuthenticationTLS(str(cert.cert), str(cert.key))),
        f"persistent://{NS}/cert-tls",
    )


def test_basic_over_tls(standalone, tenant):
    auth = pulsar.AuthenticationBasic("app-basic", PASSWORDS["app-basic"])
    round_trip(standalone.client(standalone.pulsar_ssl, auth), f"persistent://{NS}/basic-tls")


def test_token_through_the_http_lookup_path(standalone, tenant, tokens):
    """An http:// service URL: the client looks the topic up over REST (/lookup/v2, .../partitions)
    with its token, then connects to the broker URL the lookup answered."""
    url = f"http://127.0.0.1:{standalone.ports['web_port']}"
    round_trip(
        standalone.client(url, pulsar.AuthenticationToken(tokens["app-token"])),
        f"persistent://{NS}/token-http-lookup",
    )


def test_basic_through_the_https_lookup_path(standalone, tenant):
    """An https:// service URL: lookup over the TLS web port, then the TLS broker port."""
    url = f"https://localhost:{standalone.ports['web_port_tls']}"
    auth = pulsar.AuthenticationBasic("app-basic", PASSWORDS["app-basic"])
    round_trip(standalone.client(url, auth), f"persistent://{NS}/basic-https-lookup")


def test_tls_certificate_through_the_https_lookup_path(standalone, tenant):
    """The client certificate is the credential of the HTTPS lookup and of the TLS broker port."""
    url = f"https://localhost:{standalone.ports['web_port_tls']}"
    cert = standalone.pki.client("app-cert")
    round_trip(
        standalone.client(url, pulsar.AuthenticationTLS(str(cert.cert), str(cert.key))),
        f"persistent://{NS}/cert-https-lookup",
    )


def test_lookup_path_checks_the_topic_permission(standalone, tenant, tokens):
    path = f"/lookup/v2/topic/persistent/{NS}/looked-up"
    found = standalone.http(standalone.bearer(tokens["app-token"])).ok("GET", path)
    assert found["brokerUrl"] == f"pulsar://127.0.0.1:{standalone.ports['broker_port']}"
    assert found["brokerUrlTls"] == f"pulsar+ssl://127.0.0.1:{standalone.ports['broker_port_tls']}"
    assert standalone.http().error("GET", path, 401)
    reason = standalone.http(standalone.bearer(tokens["stranger"])).error("GET", path, 403)
    assert "stranger" in reason
    partitions = f"/admin/v2/persistent/{NS}/looked-up/partitions"
    assert standalone.http(standalone.bearer(tokens["stranger"])).error("GET", partitions, 403)
    # the topic list of a pattern subscription: a namespace grant (or tenant admin) is needed
    listing = f"/admin/v2/namespaces/{NS}/topics"
    assert isinstance(standalone.http(standalone.bearer(tokens["app-token"])).ok("GET", listing), list)
    assert standalone.http(standalone.bearer(tokens["stranger"])).error("GET", listing, 403)


def test_grants_limit_what_each_role_does(standalone, tenant, tokens):
    topic = f"persistent://{NS}/limits"
    # viewer (basic) may consume, not produce
    client = standalone.client(
        standalone.pulsar_ssl, pulsar.AuthenticationBasic("viewer", PASSWORDS["viewer"])
    )
    try:
        client.subscribe(topic, "view").close()
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
    finally:
        client.close()
    # a valid token without any grant: neither
    client = standalone.client(standalone.pulsar_ssl, pulsar.AuthenticationToken(tokens["stranger"]))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "s")
    finally:
        client.close()
    # no credentials, a wrong password, a certificate of another authority: not even connected
    untrusted = standalone.pki.untrusted_client("app-cert")
    for auth in (
        None,
        pulsar.AuthenticationBasic("app-basic", "wrong"),
        pulsar.AuthenticationTLS(str(untrusted.cert), str(untrusted.key)),
    ):
        client = standalone.client(standalone.pulsar_ssl, auth, operation_timeout_seconds=REFUSED_TIMEOUT)
        try:
            with pytest.raises(pulsar.PulsarException):
                client.create_producer(topic)
        finally:
            client.close()
    assert standalone.proc is not None and standalone.proc.poll() is None  # the broker stays up
