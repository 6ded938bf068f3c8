"""Re-export the compacted view after every successful compaction (the ``compactedExport`` policy).

``export_after_compaction`` is a post-compaction hook (``compaction.hooks``): the entry point
(``cli.standalone``) hands it to the broker, whose compaction monitor calls it in the run's worker
thread once the new compacted view is committed. It looks up the policy in force (the topic's own,
else its namespace's), and when there is one writes the view with ``export.export_compacted``:

* read straight from the broker's own data directory (the direct path, read-only), on the
  process's Spark session (the one compaction uses);
* to the location ``compaction.hooks.export_location`` derives from the topic's name under the
  operator's export root (each partition of a partitioned topic gets its own table), never to a
  path the policy chose;
* incrementally where the format allows: an existing Delta table is MERGEd (only the rows of
  changed keys are written), an Iceberg table gets a new snapshot, Parquet is rewritten.

Topics without a policy cost one metadata read per compaction, and no Spark work.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def export_after_compaction(storage: Any, config: Any, topic: str, result: Any) -> None:
    from ..compaction.hooks import applied_export_policy, export_location
    from ..compaction.strategies import allowed_strategy_classes

    found = applied_export_policy(storage.policies, topic)
    if found is None:
        return
    policy, scope = found
    # the location is derived again at every run (never the stored path): a policy stored before
    # the export root existed, or a root the operator has since removed, exports nothing
    path = export_location(config, topic, policy)
    from ..compaction.jobs.session import get_session
    from .export import export_compacted

    options = {"path": str(storage.data_dir)}
    classes = sorted(allowed_strategy_classes(config))
    if classes:  # view=latest folds with the topic's strategy: only what the operator allowed
        options["compactionStrategyClasses"] = ",".join(classes)
    message = export_compacted(
        get_session(),
        topic,
        path,
        policy.get("format", "parquet"),
        view=policy.get("view", "compacted"),
        partition_by=policy.get("partitionBy", []),
        options=options,
    )
    log.info("compactedExport of %s (%s policy): %s", topic, scope, message)
