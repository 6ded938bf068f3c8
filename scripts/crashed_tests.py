"""Print the node ids of the tests a pytest-xdist run lost to a crashed worker, one per line,
from the run's JUnit XML report -- and nothing at all if any failure or error of the run was
something else, so ``scripts/test.sh`` reruns crashes only when they are the whole story.

Usage: python scripts/crashed_tests.py REPORT.xml
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

CRASH = re.compile(r"worker '[^']+' crashed while running '([^']+)'")


def crashed(report: str) -> list[str]:
    ids, other = [], False
    for case in ET.parse(report).getroot().iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            m = CRASH.search((bad.get("message") or "") + "\n" + (bad.text or ""))
            if m:
                ids.append(m.group(1))
            else:
                other = True
    return [] if other else sorted(set(ids))


if __name__ == "__main__":
    # one id per line and nothing else: an empty list must print no line at all, or the caller
    # would read one empty id and rerun the whole suite in place of the failed run
    for node_id in crashed(sys.argv[1]):
        print(node_id)
