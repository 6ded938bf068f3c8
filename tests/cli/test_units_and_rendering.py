import pytest

from compactmq.cli.admin import namespace_path, render_progress, topic_path
from compactmq.admin.units import parse_duration_seconds, parse_size
from compactmq.errors import InvalidInput, InvalidTopicName


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", 0),
        ("100", 100),
        ("100M", 100 * 1024**2),
        ("10g", 10 * 1024**3),
        ("1K", 1024),
        ("-1", -1),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("3h", 10800),
        ("2d", 172800),
        ("1w", 604800),
        ("-1", -1),
    ],
)
def test_durations(text, expected):
    assert parse_duration_seconds(text) == expected


@pytest.mark.parametrize("bad", ["", "M", "10X", "1.5G", "-2", "ten"])
def test_bad_sizes_and_durations_say_what_to_write(bad):
    with pytest.raises(InvalidInput, match="e.g."):
        parse_size(bad)
    with pytest.raises(InvalidInput, match="e.g."):
        parse_duration_seconds(bad.replace("G", "h").replace("M", "m"))


def test_paths_follow_admin_v2():
    assert topic_path("t") == "/admin/v2/persistent/public/default/t"
    assert topic_path("non-persistent://a/b/c d") == "/admin/v2/non-persistent/a/b/c%20d"
    assert namespace_path("public/default") == "/admin/v2/namespaces/public/default"
    with pytest.raises(InvalidInput):
        namespace_path("public")
    with pytest.raises(InvalidTopicName):
        topic_path("a/b")


def test_progress_line():
    running = {
        "status": "RUNNING",
        "lastError": "",
        "progress": {"phase": "phase-one", "entriesProcessed": 500, "entriesTotal": 1000, "etaSeconds": 3},
    }
    line = render_progress(running, width=10)
    assert (
        "phase-one" in line
        and "[#####-----]" in line
        and "500/1,000" in line
        and "50%" in line
        and "eta 3s" in line
    )
    assert render_progress({"status": "SUCCESS", "lastError": ""}) == "SUCCESS"
    assert render_progress({"status": "ERROR", "lastError": "disk full"}) == "ERROR: disk full"


def test_progress_line_of_a_partitioned_topic():
    """One bar for the whole topic; the final line counts partitions by status, and lists them
    when the broker sent them (``--per-partition``)."""
    running = {
        "status": "RUNNING",
        "lastError": "",
        "partitionCounts": {"RUNNING": 3},
        "progress": {"phase": "phase-two", "entriesProcessed": 300, "entriesTotal": 400, "etaSeconds": 1},
    }
    line = render_progress(running, width=4)
    assert "[###-]" in line and "300/400" in line and line.endswith("(3 partitions)")
    assert "\n" not in line
    failed = {
        "status": "ERROR",
        "lastError": "t-partition-1: disk full",
        "partitionCounts": {"SUCCESS": 1, "ERROR": 1},
        "partitions": {
            "t-partition-1": {"status": "ERROR", "lastError": "disk full"},
            "t-partition-0": {"status": "SUCCESS", "lastError": ""},
        },
    }
    assert render_progress(failed).splitlines() == [
        "ERROR (2 partitions: ERROR 1, SUCCESS 1): t-partition-1: disk full",
        "  t-partition-0: SUCCESS",
        "  t-partition-1: ERROR: disk full",
    ]
