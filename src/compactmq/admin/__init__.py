"""The broker's web port: Pulsar admin v2 REST API, Prometheus ``/metrics``, OpenAPI.

Modules:

* ``server``     -- ``start(service, host, port)``, the plug ``BrokerServer.start_web`` calls;
* ``app``        -- the aiohttp application and the one place errors become HTTP statuses;
* ``router``     -- routing on raw path segments, and the OpenAPI document built from the routes;
* ``topics``     -- topic paths: create/list/delete, partitioned topics, stats, compaction, policies;
* ``namespaces`` -- tenants, namespaces and namespace policies;
* ``policies``   -- the policy table shared by topics and namespaces (validation, rendering);
* ``metrics``    -- traffic counters and the Prometheus text exposition.

Compactions themselves are run by ``compactmq.broker.compaction_monitor``; this package only
asks it to start one and reports what it says.
"""
