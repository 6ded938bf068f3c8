"""The asyncio broker: Pulsar's binary protocol served over compactmq's storage.

How the pieces fit (one arrow = "owns" or "calls")::

    BrokerServer (server)          listening socket, web-service plug, the shutdown order
      BrokerService                config, Storage, thread pool (run_blocking), ServerState
        ServerState                every connection and background task
        TopicManager               loaded Topics by canonical name; partitioned metadata
          Topic                    ManagedLedger, producers, subscriptions, group-commit
                                   appends, TailCache, LedgerEntrySource
            Producer (producers)   access modes (Shared / Exclusive)
            Subscription           cursor (+ CursorView snapshot), acks, redelivery counts,
              (subscriptions)      batch-index acks, seek; one Dispatcher
              Dispatcher           read position, replay set, pending entries; delivery
                (dispatchers)      rules per subscription type, choosing with selectors
                EntrySource        where entries come from (entry_source): the live topic,
                                   or the compacted view (compacted_source, read compacted)
              Consumer             permits (flow.PermitWindow), its connection
          NonPersistentTopics      non-persistent:// topics in use (nonpersistent): no ledger,
                                   each message offered to the consumers connected, or dropped
        SchemaRegistry (schemas)   schema versions per topic; compatibility (schema_compat)
        Housekeeping (server)      ledger rollover by age, retention
        authentication,            compactmq.auth: who a client is, what its role may do;
        authorization              asked at CONNECT and before topic commands (security),
        CredentialRefresher        AUTH_CHALLENGE for expired credentials (security)
    ServerConnection (connection)  asyncio protocol: socket (plain or TLS) <-> protocol.frames
      CommandHandler (handlers)    one method per client command, each its own error boundary

Storage is synchronous: the broker calls it only through ``BrokerService.run_blocking`` (a
thread pool), never on the event loop.
"""
