"""The broker's web port: Pulsar admin v2 REST API, Prometheus ``/metrics``, OpenAPI.

Modules:

* ``server``     -- ``start(service, host, port)``, the plug ``BrokerServer.start_web`` calls;
* ``app``        -- the aiohttp application and the one place errors become HTTP statuses;
* ``router``     -- routing on raw path segments, and the OpenAPI document built from the routes;
* ``topics``     -- topic paths: create/list/delete, partitioned topics, compaction, policies;
* ``topic_stats`` -- a topic's stats, partitioned stats and internal stats;
* ``topic_lookup`` -- what every topic handler does first (name, persistent, partitioned or not);
* ``namespaces`` -- tenants, namespaces and namespace policies;
* ``policies``   -- one declaration per policy, shared by topics, namespaces and the CLI
  (``policy_values``: REST validation and rendering; ``policy_forms``: the CLI's verbs and flags;
  ``units``: sizes and durations as pulsar-admin writes them);
* ``metrics``    -- traffic counters and the Prometheus text exposition.

Compactions themselves are run by ``compactmq.broker.compaction_monitor``; this package only
asks it to start one and reports what it says.
"""
