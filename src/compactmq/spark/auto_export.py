"""Re-export the compacted view after every successful compaction (the ``compactedExport`` policy).

``export_after_compaction`` is a post-compaction hook (``compaction.hooks``): the entry point
(``cli.standalone``) hands it to the broker, whose compaction monitor calls it in the run's worker
thread once the new compacted view is committed. It looks up the policy in force (the topic's own,
else its namespace's), and when there is one writes the view with ``export.export_compacted``:

* read straight from the broker's own data directory (the direct path, read-only), on the
  process's Spark session (the one compaction uses);
* to ``path`` for a topic policy on a non-partitioned topic, else to ``path/<local name>`` (a
  namespace policy covers many topics, and a partitioned topic's policy is copied to each
  partition, so each partition gets its own table);
* incrementally where the format allows: an existing Delta table is MERGEd (only the rows of
  changed keys are written), an Iceberg table gets a new snapshot, Parquet is rewritten.

Topics without a policy cost one metadata read per compaction, and no Spark work.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def table_path(policy: dict, scope: str, topic: str) -> str:
    from ..naming import TopicName

    name = TopicName.parse(topic)
    if scope == "topic" and name.partition_index < 0:
        return policy["path"]
    return os.path.join(policy["path"], name.local_name)


def export_after_compaction(storage: Any, config: Any, topic: str, result: Any) -> None:
    from ..compaction.hooks import applied_export_policy

    found = applied_export_policy(storage.metadata, topic)
    if found is None:
        return
    policy, scope = found
    from ..compaction.spark.session import get_session
    from .export import export_compacted

    path = table_path(policy, scope, topic)
    message = export_compacted(
        get_session(),
        topic,
        path,
        policy.get("format", "parquet"),
        view=policy.get("view", "compacted"),
        partition_by=policy.get("partitionBy", []),
        options={"path": str(storage.data_dir)},
    )
    log.info("compactedExport of %s (%s policy): %s", topic, scope, message)
