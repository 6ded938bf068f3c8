"""Every broker.conf key compactmq implements, declared once: its type, default and a line of help.

``SETTINGS`` is the table the rest of ``compactmq.config`` reads: ``loading`` coerces file and
command-line values to the declared type, ``pulsar_keys`` suggests a declared key for a typo.
Add a key here, in its section (Pulsar's name when Pulsar has one); nothing else needs to know
about it for ``load_config`` to accept it. The constants above the table are values some keys
take (retention modes, Pulsar provider class names, the historical TLS ports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: keys with this prefix pass through, untouched, to the Spark session builder
SPARK_PREFIX = "spark."

#: ``topicCompactionRetentionMode`` values (compaction's ``RetentionFilter`` explains them)
RETENTION_BOUNDED = "retention-bounded"
KEEP_UNTIL_TOMBSTONE = "keep-until-tombstone"
RETENTION_MODES = (RETENTION_BOUNDED, KEEP_UNTIL_TOMBSTONE)

# Pulsar class names accepted in authenticationProviders / authorizationProvider.
PROVIDER_TOKEN = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
PROVIDER_TLS = "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"
PROVIDER_BASIC = "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic"
PULSAR_AUTHORIZATION_PROVIDER = "org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider"

# Ports that are off unless set: Pulsar's Optional<Integer> brokerServicePortTls/webServicePortTls.
# The deprecated ``tlsEnabled=true`` turns both on at Pulsar's historical defaults.
DEFAULT_BROKER_PORT_TLS = 6651
DEFAULT_WEB_PORT_TLS = 8443

# Values never printed (repr, logs): token keys, htpasswd content, passwords of ignored parts.
_SECRET_MARKERS = ("secret", "password", "authenticationparameters", "basicauthconf")


class OptionalInt:
    """Setting type: an integer, or ``None`` when unset/empty (a listener that is off)."""


@dataclass(frozen=True)
class Setting:
    type: type
    default: Any
    help: str


def _s(type_: type, default: Any, help_: str) -> Setting:
    return Setting(type_, default, help_)


SETTINGS: dict[str, Setting] = {
    # --- standalone broker -------------------------------------------------------------
    "dataDir": _s(str, "data", "directory holding ledgers, compacted ledgers and metadata.db"),
    # --- metadata store (Pulsar's keys; declared here, so IGNORED_PREFIXES no longer swallows them) ---
    "metadataStoreUrl": _s(
        str,
        "",
        "metadata store: empty = embedded (sqlite: metadata.db in dataDir), sqlite:<path>, "
        "zk:host:port[,host:port...][/chroot], memory:[name] (tests)",
    ),
    "configurationMetadataStoreUrl": _s(
        str, "", "store of tenants, namespaces and partitioned topics; empty: the same as metadataStoreUrl"
    ),
    "metadataStoreSessionTimeoutMillis": _s(
        int, 30000, "metadata store session timeout: ephemeral keys of a silent session go after it"
    ),
    "metadataStoreOperationTimeoutSeconds": _s(int, 30, "longest wait for one metadata store operation"),
    "bindAddress": _s(str, "127.0.0.1", "address the broker and web service listen on"),
    "advertisedAddress": _s(str, "", "host name put in lookup answers; empty means bindAddress"),
    "advertisedListeners": _s(
        str,
        "",
        "named addresses answered by lookups: name:pulsar://host:port,name:pulsar+ssl://host:port,...",
    ),
    "internalListenerName": _s(str, "", "listener answered when a client names none (default: the first)"),
    "brokerServicePort": _s(
        OptionalInt, 6650, "Pulsar binary protocol port; empty: off (then brokerServicePortTls must be set)"
    ),
    "webServicePort": _s(
        OptionalInt, 8080, "admin REST API and /metrics port; empty: off (then webServicePortTls must be set)"
    ),
    # --- cluster (broker.cluster): several brokers sharing a zk: metadataStoreUrl ----------
    "clusterName": _s(
        str, "standalone", "name of the cluster: brokers that share a zk: store and this name form one"
    ),
    "defaultNumberOfNamespaceBundles": _s(
        int, 4, "hash ranges a namespace is split into (fixed once a namespace's bundles are first used)"
    ),
    "loadBalancerEnabled": _s(
        bool,
        True,
        "true: the leader broker assigns an unowned bundle to the broker owning the fewest bundles; "
        "false: the broker a lookup reaches takes it",
    ),
    "loadBalancerReportUpdateMinIntervalMillis": _s(
        int, 5000, "how often a broker rewrites its load report (bundles, topics) in the metadata store"
    ),
    "allowAutoTopicCreation": _s(bool, True, "create topics on first use by a client"),
    "allowAutoTopicCreationType": _s(str, "non-partitioned", "non-partitioned or partitioned"),
    "defaultNumPartitions": _s(int, 1, "partitions of an auto-created partitioned topic"),
    "maxNumPartitionsPerPartitionedTopic": _s(
        int,
        0,
        "most partitions a partitioned topic may have (REST, autoTopicCreation policies); 0: no limit "
        "(Pulsar's default)",
    ),
    "keepAliveIntervalSeconds": _s(
        int,
        30,
        "PING interval; a peer silent for twice this is dropped, one that has not completed "
        "CONNECT this long after accept too",
    ),
    "brokerDeleteInactiveTopicsEnabled": _s(
        bool, True, "delete topics without producers, consumers (and, per the mode, subscriptions)"
    ),
    "brokerDeleteInactiveTopicsFrequencySeconds": _s(
        int, 60, "how often inactive topics are deleted, or unloaded from memory when they are kept"
    ),
    "brokerDeleteInactiveTopicsMode": _s(
        str,
        "delete_when_no_subscriptions",
        "delete_when_no_subscriptions or delete_when_subscriptions_caught_up",
    ),
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": _s(
        OptionalInt, None, "how long a topic must be inactive before it goes; empty: the frequency"
    ),
    "maxMessageSize": _s(int, 5 * 1024 * 1024, "largest message a producer may send, in bytes"),
    "brokerMaxConnections": _s(
        int, 0, "open binary-protocol connections allowed; more are closed at accept (0 = unlimited)"
    ),
    "brokerMaxConnectionsPerIp": _s(
        int, 0, "open binary-protocol connections allowed per remote IP (0 = unlimited)"
    ),
    "maxPendingPublishBytesPerConnection": _s(
        int, 16 * 1024 * 1024, "unpersisted bytes per connection above which its socket is paused"
    ),
    "maxConcurrentLookupRequest": _s(int, 50000, "accepted for broker.conf compatibility"),
    # --- the web port's limits (admin.http_limits) ---------------------------------------
    "httpMaxRequestSize": _s(
        int, -1, "largest HTTP request body in bytes; <= 0: 1 MiB (compactmq never runs without a limit)"
    ),
    "httpMaxRequestHeaderSize": _s(int, 8192, "longest HTTP request line or header field, in bytes"),
    "httpRequestHeaderTimeoutSeconds": _s(
        int, 30, "seconds an HTTP connection has to deliver a request's headers (compactmq's own key)"
    ),
    "httpRequestBodyTimeoutSeconds": _s(
        int, 30, "seconds an HTTP request has to deliver its body after its headers (compactmq's own key)"
    ),
    # --- deduplication, producers, consumers, schemas, listeners (issue 12) ---------------
    "brokerDeduplicationEnabled": _s(
        bool, False, "drop messages whose sequence id a producer already published"
    ),
    "brokerDeduplicationEntriesInterval": _s(
        int, 1000, "entries between two snapshots of the deduplication state"
    ),
    "brokerDeduplicationSnapshotIntervalSeconds": _s(
        int, 120, "seconds between two snapshots of the deduplication state"
    ),
    "maxProducersPerTopic": _s(int, 0, "producers a topic accepts at once (0: no limit)"),
    "maxConsumersPerTopic": _s(int, 0, "consumers a topic accepts at once (0: no limit)"),
    "maxConsumersPerSubscription": _s(int, 0, "consumers a subscription accepts at once (0: no limit)"),
    "acknowledgmentAtBatchIndexLevelEnabled": _s(
        bool,
        True,
        "keep acknowledgements of single messages of a batch (PIP-54): redelivery then skips them; "
        "false, Pulsar's default, ignores them until the whole batch is acknowledged (compactmq "
        "defaults to true)",
    ),
    "maxUnackedMessagesPerConsumer": _s(
        int,
        50000,
        "Shared/Key_Shared: a consumer holding this many unacknowledged messages gets no more (0: off)",
    ),
    "maxUnackedMessagesPerSubscription": _s(
        int, 200000, "Shared/Key_Shared: a subscription with this many unacknowledged messages stops (0: off)"
    ),
    "schemaCompatibilityStrategy": _s(
        str,
        "FULL",
        "schema changes a topic accepts when neither it nor its namespace says: ALWAYS_COMPATIBLE, "
        "ALWAYS_INCOMPATIBLE, BACKWARD, FORWARD, FULL or a *_TRANSITIVE form",
    ),
    "isAllowAutoUpdateSchemaEnabled": _s(bool, True, "producers may register new schema versions"),
    "isSchemaValidationEnforced": _s(
        bool, False, "refuse producers without a schema on topics that have one"
    ),
    # --- storage (managed ledger) ------------------------------------------------------
    "managedLedgerMaxEntriesPerLedger": _s(
        int, 50000, "roll a ledger after this many entries (once older than the minimum rollover time)"
    ),
    "managedLedgerCacheSizeMB": _s(
        int,
        256,
        "memory for recently published entries served to consumers that keep up (all topics; "
        "entries count with their in-memory overhead)",
    ),
    "managedLedgerCacheEvictionTimeThresholdMillis": _s(
        int, 1000, "cached entries older than this are evicted (0: no age limit)"
    ),
    "managedLedgerCacheEvictionIntervalMs": _s(int, 10, "how often cached entries are checked for age"),
    "managedLedgerMaxSizePerLedgerMbytes": _s(
        int, 2048, "roll a ledger after this many MiB (once older than the minimum rollover time)"
    ),
    "managedLedgerMaxLedgerRolloverTimeMinutes": _s(int, 240, "roll a ledger after this age"),
    "managedLedgerMinLedgerRolloverTimeMinutes": _s(
        int,
        10,
        "never roll a ledger younger than this, however full (Pulsar's rule; 0: roll as soon as a limit is reached)",
    ),
    "managedLedgerSyncData": _s(bool, True, "fsync before acknowledging an append (journalSyncData)"),
    "managedLedgerGroupCommitMaxDelayMicros": _s(
        int,
        1000,
        "longest an append waits to share an fsync with others (group commit); also the least spacing "
        "of a busy topic's syncs (storage.group_commit.BUSY_SYNC_RATE) and the pause between reads of a "
        "busy producer connection (broker.flow.BUSY_READ_RATE)",
    ),
    "managedLedgerDefaultMarkDeleteRateLimit": _s(
        float, 1.0, "most cursor positions written to the metadata store per second per cursor (0: every ack)"
    ),
    "managedLedgerMaxUnackedRangesToPersist": _s(
        int, 10000, "acked ranges of a cursor kept in the metadata store; more stay in memory only"
    ),
    "managedLedgerCursorPositionFlushSeconds": _s(
        int, 60, "how often cursor positions held back by the rate limit are written"
    ),
    # --- ledgers written straight to an object store (storage/object_ledgers.py); compactmq's own
    # keys (Pulsar has no such store), used by cluster mode. A flush is ONE object write.
    "objectLedgerStorageUrl": _s(
        str,
        "",
        "where managed ledgers are written: empty keeps them on local disk; "
        "s3://bucket[/prefix][?region=R&endpoint=http://host:port] or file:///dir puts every "
        "ledger in that object store (so that in a cluster a topic's data follows its ownership)",
    ),
    "objectLedgerFlushIntervalMillis": _s(
        int,
        5,
        "longest written entries wait in memory to share one object write (a sync waits at most "
        "this, then writes; 0: write at once)",
    ),
    "objectLedgerFlushMaxBytes": _s(
        int, 4 * 1024 * 1024, "write a flush object as soon as this many bytes wait (one PUT each)"
    ),
    "objectLedgerGroupFlushEnabled": _s(
        bool,
        True,
        "on (the default, chosen by bench/cluster_bench.py --compare-group-flush): flushes of "
        "several topics' object ledgers asked while an object write is in flight go together as "
        "ONE shared object, their ranges committed in the metadata store; a flush with nothing "
        "else waiting is its ledger's own object at once, so a lone producer pays no extra wait "
        "and no metadata write; off: one object per ledger per flush, written side by side",
    ),
    "objectLedgerTailCacheBytes": _s(
        int, 1024 * 1024, "bytes of a ledger being written kept in memory after their flush, for reads"
    ),
    "defaultRetentionTimeInMinutes": _s(int, 0, "keep acknowledged messages this long (-1: forever)"),
    "defaultRetentionSizeInMB": _s(int, 0, "keep acknowledged messages up to this size (-1: no limit)"),
    "retentionCheckIntervalInSeconds": _s(int, 120, "how often ledgers past retention are deleted"),
    # --- compaction --------------------------------------------------------------------
    "compactionServiceFactoryClassName": _s(
        str,
        "compactmq.compaction.jobs.SparkCompactionServiceFactory",
        "dotted class name of the CompactionServiceFactory (PIP-278)",
    ),
    "brokerServiceCompactionMonitorIntervalInSeconds": _s(
        int, 60, "how often topics are checked against their compaction threshold"
    ),
    "brokerServiceCompactionThresholdInBytes": _s(
        int, 0, "backlog since the horizon that triggers compaction; 0 disables"
    ),
    "brokerServiceCompactionMaxLagInSeconds": _s(
        int,
        0,
        "compact a topic whose oldest uncompacted message is older than this, whatever its "
        "backlog (the compactionMaxLagSeconds policy overrides it); 0 disables",
    ),
    "brokerServiceCompactionMinLagInSeconds": _s(
        int,
        0,
        "messages younger than this are not compacted yet (the compactionMinLagSeconds "
        "policy overrides it); 0: every message up to the last one",
    ),
    "topicCompactionTombstoneRetentionSeconds": _s(
        int, 0, "keep a tombstone in the compacted view until it is this old (keep-latest); 0: drop at once"
    ),
    "topicCompactedViewKeyTtlSeconds": _s(
        int,
        0,
        "drop a key from the compacted view once its latest message is this old (keep-latest); 0: never",
    ),
    "compactionMaxConcurrentRuns": _s(int, 1, "compactions running at once in this broker"),
    "compactionJointMaxTopics": _s(
        int,
        100,
        "topics one joint compaction job may take: runs waiting for a worker (the due topics of a "
        "monitor check, triggers during a run) are compacted together, up to this many",
    ),
    "compactionJointLagSplit": _s(
        bool,
        False,
        "while topics with a maximum lag keep falling due, split them into more, shorter joint jobs "
        "taken round-robin when a model of job length learned from the last jobs says the wait "
        "drops (lowers typical lags; measured under load it raised the largest ones: off by default)",
    ),
    "compactionJointMaxBytes": _s(
        int,
        1 << 30,
        "backlog bytes one joint compaction job may take (the first topic always goes)",
    ),
    "compactionChainMaxRuns": _s(
        int,
        8,
        "runs a chained compacted view may have before a run rewrites it whole; 1: every run rewrites",
    ),
    "compactionChainMaxStaleRatio": _s(
        float, 0.25, "rewrite a chained compacted view whole once this share of its stored entries is dead"
    ),
    "compactionChainMasks": _s(
        bool,
        True,
        "an incremental run masks an old batch that lost some messages instead of rewriting it",
    ),
    "compactionDirectIO": _s(
        bool,
        True,
        "phase-two tasks write compacted segments with direct I/O (O_DIRECT), bypassing the page cache, "
        "where the file system allows it (elsewhere they write through it)",
    ),
    "compactionChainDeltaRuns": _s(
        bool,
        True,
        "an incremental keep-latest run extending a chained view sends only the new messages through "
        "Spark and looks their keys up in the view's key sidecar; false: re-aggregate every key of the view",
    ),
    "compactionObjectStoreChains": _s(
        bool,
        True,
        "a view written to the object store is a chain of segments, so an incremental run uploads only "
        "its new segment and a small manifest; false: every run uploads the whole view",
    ),
    "compactionSparkWarmup": _s(
        bool,
        True,
        "start and warm the compaction SparkSession in the background when the broker starts "
        "(a scratch run), so the first compaction does not wait for Spark; false: start it at the first run",
    ),
    "topicCompactionRetainNullKey": _s(bool, False, "keep keyless messages in the compacted view"),
    "latestValueTailIndexMaxSizeMB": _s(
        int,
        64,
        "memory for the key indexes of the uncompacted tails of topics asked for a key's latest value "
        "(all topics; beyond it a tail is scanned per lookup); compactmq's own key",
    ),
    "latestValueKeyIndexMaxSizeMB": _s(
        int,
        256,
        "memory for the key indexes of compacted views asked for a key's latest value (about 33 bytes "
        "a key; all topics, the least recently asked dropped first, the asked one always kept); "
        "compactmq's own key",
    ),
    "topicCompactionStrategy": _s(
        str, "keep-latest", "keep-latest, keep-first, event-time, or a dotted class name"
    ),
    "topicCompactionStrategyAllowedClasses": _s(
        str,
        "",
        "comma list of dotted strategy class names a compactionStrategy policy may name (besides "
        "keep-latest, keep-first, event-time and topicCompactionStrategy); empty: built-ins only",
    ),
    "compactionInProcessMaxBytes": _s(
        int,
        0,
        "a keep-latest run reading at most this many bytes (the topic's live ledgers after the "
        "horizon, whole, and its previous view) runs in the broker's process without a Spark job, "
        "saving a job's fixed cost (about 0.3 s warm; 8388608 suits topics of ~50 k small "
        "messages); 0: every run is a Spark job",
    ),
    "compactionSparkFusedMaxBytes": _s(
        int,
        64 * 1024 * 1024,
        "a keep-latest full run of one group (a topic under ~20 k entries) reading at most this "
        "many bytes (its live ledgers, whole) runs on Spark as ONE task of one job, without the "
        "shuffles of the three-stage job (the same view; a small run's fixed cost about halves); "
        "0: every run takes the three-stage job",
    ),
    "compactionMonitorFullScanIntervalInSeconds": _s(
        int,
        300,
        "the compaction monitor's check looks only at topics appended to, whose policies changed "
        "through this broker, or whose lags come due; every this often it looks at every topic "
        "(changes made elsewhere: another broker's namespace policy); 0: every check looks at every topic",
    ),
    # --- compactedExport policy: where exports may go (docs/security.md) -----------------
    "compactedExportRoot": _s(
        str,
        "",
        "local directory under which compactedExport tables are written, each at "
        "<root>/<domain>/<tenant>/<namespace>/<topic>; empty: the compactedExport policy is refused",
    ),
    "compactedExportObjectStoreRoots": _s(
        str,
        "",
        "comma list of object-store roots (s3://bucket/prefix, gs://bucket/prefix) a compactedExport "
        'policy may choose with "root" instead of compactedExportRoot (Delta tables only)',
    ),
    "topicCompactionRetentionMode": _s(
        str,
        RETENTION_BOUNDED,
        "retention-bounded (a message trimmed by retention leaves the compacted view too) "
        "or keep-until-tombstone (keys stay until deleted)",
    ),
    # --- authentication (Pulsar's keys and defaults) -----------------------------------
    "authenticationEnabled": _s(bool, False, "authenticate every client connection and request"),
    "authenticationProviders": _s(
        str, "", "comma list of Pulsar provider class names (AuthenticationProviderToken, ...Tls, ...Basic)"
    ),
    "authenticationRefreshCheckSeconds": _s(
        int, 60, "how often connections are checked for expired credentials (AUTH_CHALLENGE)"
    ),
    "anonymousUserRole": _s(str, "", "role given to clients without credentials; empty refuses them"),
    "authenticateMetricsEndpoint": _s(
        bool,
        None,
        "require authentication on /metrics; unset: true when authenticationEnabled "
        "(Pulsar's default is false: compactmq does not expose topic names to strangers)",
    ),
    "tokenSecretKey": _s(str, "", "HS256 secret: file:///path, data:;base64,..., or the base64 text"),
    "tokenPublicKey": _s(str, "", "public key for RS256/ES256 tokens: file:///path or data:;base64,..."),
    "tokenPublicAlg": _s(str, "RS256", "signature algorithm of tokenPublicKey (RS256, ES256, ...)"),
    "tokenAuthClaim": _s(str, "sub", "token claim that holds the role"),
    "tokenAudienceClaim": _s(str, "", "token claim holding the audience; empty: audience not checked"),
    "tokenAudience": _s(str, "", "audience this broker accepts (in tokenAudienceClaim)"),
    "tokenAllowedClockSkewSeconds": _s(int, 0, "leeway for exp/nbf/iat checks, in seconds"),
    "basicAuthConf": _s(str, "", "htpasswd file for basic auth: a path, or its content in base64"),
    # --- authorization -----------------------------------------------------------------
    "authorizationEnabled": _s(bool, False, "check each role's permissions (Pulsar's model)"),
    "authorizationProvider": _s(
        str, PULSAR_AUTHORIZATION_PROVIDER, "only Pulsar's default provider is implemented"
    ),
    "superUserRoles": _s(str, "", "comma list of roles that may do everything"),
    "brokerClientAuthenticationPlugin": _s(
        str,
        "",
        "credentials of the broker's own admin client (Pulsar's client class name: AuthenticationToken, "
        "AuthenticationBasic, AuthenticationTls); at start it creates public/default with them",
    ),
    "brokerClientAuthenticationParameters": _s(
        str, "", "parameters of brokerClientAuthenticationPlugin (token:..., file:///..., JSON)"
    ),
    # --- TLS ---------------------------------------------------------------------------
    "brokerServicePortTls": _s(OptionalInt, None, "binary protocol over TLS; empty: off, 0: a free port"),
    "webServicePortTls": _s(OptionalInt, None, "admin REST API over HTTPS; empty: off, 0: a free port"),
    "tlsEnabled": _s(bool, False, "deprecated: turns on brokerServicePortTls/webServicePortTls (6651/8443)"),
    "tlsCertificateFilePath": _s(str, "", "PEM certificate (chain) of the broker"),
    "tlsKeyFilePath": _s(str, "", "PEM private key of the broker (PKCS#8 or PKCS#1)"),
    "tlsTrustCertsFilePath": _s(str, "", "PEM CA certificates that client certificates are verified with"),
    "tlsAllowInsecureConnection": _s(bool, False, "accept client certificates that do not verify"),
    "tlsRequireTrustedClientCertOnConnect": _s(bool, False, "refuse TLS clients without a trusted cert"),
    "tlsProtocols": _s(str, "", "comma list of TLS versions, e.g. TLSv1.3,TLSv1.2; empty: the default"),
    "tlsCiphers": _s(str, "", "comma list of cipher suites; empty: the default"),
    # --- tiered storage (offload), Pulsar's keys; see compactmq.storage.offload ----------
    "managedLedgerOffloadDriver": _s(
        str,
        "",
        "where sealed ledgers are offloaded: aws-s3 or S3 (any S3-compatible endpoint), "
        "google-cloud-storage, filesystem (fileSystemURI); empty disables offload",
    ),
    "s3ManagedLedgerOffloadBucket": _s(str, "", "bucket offloaded ledgers go to (aws-s3, S3)"),
    "s3ManagedLedgerOffloadRegion": _s(str, "", "region of the bucket (empty: the SDK's default)"),
    "s3ManagedLedgerOffloadServiceEndpoint": _s(
        str, "", "endpoint of an S3-compatible service, e.g. http://127.0.0.1:9000 (empty: AWS)"
    ),
    "s3ManagedLedgerOffloadMaxBlockSizeInBytes": _s(
        int, 64 * 1024 * 1024, "size of the blocks a ledger is written to the object store in"
    ),
    "s3ManagedLedgerOffloadReadBufferSizeInBytes": _s(
        int, 1024 * 1024, "bytes fetched (one ranged read) and cached per read of an offloaded ledger"
    ),
    "gcsManagedLedgerOffloadBucket": _s(str, "", "bucket offloaded ledgers go to (google-cloud-storage)"),
    "fileSystemURI": _s(
        str, "", "root of the filesystem driver: file:///path, hdfs://host:port/path or a mounted path"
    ),
    "managedLedgerOffloadDeletionLagMs": _s(
        int, 4 * 60 * 60 * 1000, "delete the local copy of an offloaded ledger this long after offload"
    ),
    "managedLedgerOffloadAutoTriggerSizeThresholdBytes": _s(
        int, -1, "offload sealed ledgers while a topic keeps more than this locally (-1: never, 0: at once)"
    ),
    "managedLedgerOffloadThresholdInSeconds": _s(
        int, -1, "offload sealed ledgers older than this (-1: never)"
    ),
    "managedLedgerOffloadAllowedLocations": _s(
        str,
        "",
        "comma list of offload locations a namespace offloadPolicies may name besides the broker's own: "
        "driver=bucket-or-URI[@endpoint], e.g. aws-s3=team-bucket@https://s3.example.com, "
        "filesystem=file:///mnt/offload; empty: only the location configured above",
    ),
    "managedLedgerOffloadReadCacheSizeInBytes": _s(
        int, 64 * 1024 * 1024, "memory for recently read ranges of offloaded ledgers (compactmq's own key)"
    ),
}

SPARK_DEFAULTS: dict[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "compactmq-compaction",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
}


def is_secret_key(key: str) -> bool:
    low = key.lower()
    return any(marker in low for marker in _SECRET_MARKERS)
