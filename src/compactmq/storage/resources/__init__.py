"""Typed resources over the metadata store (Pulsar's ``*Resources`` classes).

Each resource owns one subtree of the store, written once in its module with Pulsar's paths
where Pulsar has them, and speaks in names and JSON values; nothing above this package sees a
path, a version number it did not get from here, or the store's API. ``PulsarResources`` bundles
them: tenants, namespaces and partitioned topics live in the configuration store
(``configurationMetadataStoreUrl``, by default the same store), the rest in the local one.

================================  ======================================================
``TenantResources``               /admin/policies/{tenant}
``NamespaceResources``            /admin/policies/{tenant}/{namespace}
``PartitionedTopicResources``     /admin/partitioned-topics/{tenant}/{ns}/{domain}/{topic}
``ManagedLedgerResources``        /managed-ledgers/{tenant}/{ns}/persistent/{topic}[/{cursor}]
``SchemaResources``               /schemas/{tenant}/{ns}/{topic}[/{version}]
``CompactionStateResources``      /compaction/{tenant}/{ns}/persistent/{topic}
``GrantResources``                the ``auth_policies`` field of /admin/policies/{tenant}/{namespace}
``LedgerIdResources``             /ledgers/next-id
``BrokerRegistry``                /loadbalance/brokers/{host:webport} (ephemeral)
``LeaderElection``                /loadbalance/leader (ephemeral)
``OwnershipResources``            /namespace/{tenant}/{ns}/{bundle range} (ephemeral)
``UnloadHints``                   /loadbalance/unload-hints/{tenant}/{ns}/{bundle range}
``OffloadRecordResources``        /compactmq/offload/{instance | topics/... | ledgers/...}
``SealRequestResources``          /compactmq/seal-requests/request-{n}  (ephemeral, sequential)
``TopicPolicyResources``          /compactmq/topic-policies/{tenant}/{ns}/{domain}/{topic} (ours)
================================  ======================================================

``PolicyResources`` reads and writes namespace policies (fields of the namespace's Policies) and
topic policies; ``TopicMetadata`` (``topic_metadata.py``) is what a managed ledger holds: topics,
ledger lists and rate-limited cursors over ``ManagedLedgerResources``.

``CursorWriter`` writes one cursor's position at a bounded rate over ``ManagedLedgerResources``;
``MetadataCache`` keeps values read until a watch says their key changed.

Names become segments through ``encode_segment`` (Pulsar's ``Codec.encode``): a topic name can
never reach another subtree or a parent path.
"""

from __future__ import annotations

from ..metadata_store import MetadataStore
from .base import decode_segment, encode_segment
from .cache import MetadataCache
from .cluster import BrokerRegistry, LeaderElection, OwnershipResources, UnloadHints
from .compaction_state import CompactionStateResources, StaleCompaction
from .cursor_writer import CursorWriter
from .grants import GrantResources
from .ledger_ids import LedgerIdResources
from .managed_ledgers import ManagedLedgerResources
from .offload_records import OffloadRecordResources
from .policies import PolicyResources, TopicPolicyResources
from .schema_keys import SchemaResources
from .seal_requests import SealRequestResources
from .tenants import NamespaceResources, PartitionedTopicResources, TenantResources


class PulsarResources:
    def __init__(self, local: MetadataStore, configuration: MetadataStore | None = None):
        configuration = configuration or local
        self.tenants = TenantResources(configuration)
        self.namespaces = NamespaceResources(configuration)
        self.grants = GrantResources(configuration)
        self.partitioned_topics = PartitionedTopicResources(configuration)
        self.managed_ledgers = ManagedLedgerResources(local)
        self.schemas = SchemaResources(local)
        self.compaction = CompactionStateResources(local)
        self.ledger_ids = LedgerIdResources(local)
        # the cluster's coordination keys (broker.cluster): in the local store, as in Pulsar
        self.brokers = BrokerRegistry(local)
        self.leader = LeaderElection(local)
        self.ownership = OwnershipResources(local)
        self.unload_hints = UnloadHints(local)
        self.seal_requests = SealRequestResources(local)
        self.offload_records = OffloadRecordResources(local)
        self.topic_policies = TopicPolicyResources(local)
        self.policies = PolicyResources(self.namespaces, self.topic_policies)


__all__ = [
    "BrokerRegistry",
    "LeaderElection",
    "OwnershipResources",
    "UnloadHints",
    "CompactionStateResources",
    "CursorWriter",
    "GrantResources",
    "LedgerIdResources",
    "MetadataCache",
    "ManagedLedgerResources",
    "NamespaceResources",
    "OffloadRecordResources",
    "PartitionedTopicResources",
    "PolicyResources",
    "PulsarResources",
    "SchemaResources",
    "SealRequestResources",
    "StaleCompaction",
    "TenantResources",
    "TopicPolicyResources",
    "decode_segment",
    "encode_segment",
]
