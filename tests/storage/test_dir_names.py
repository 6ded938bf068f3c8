"""Topic names to directories: injective, and a directory another topic owns is never touched.

Before this rule a name part longer than 200 encoded characters was cut to ``enc[:150] + "~" +
sha1[:16]``, and a short name spelled that way mapped to the same directory; opening it deleted
the long topic's ledgers as orphans.
"""

from __future__ import annotations

import hashlib
import os
from urllib.parse import quote

import pytest

from compactmq.config import load_config
from compactmq.errors import StorageError
from compactmq.storage import ManagedLedger
from compactmq.storage.dir_owner import OWNER_FILE, read_owner
from compactmq.storage.topic_paths import topic_relpath

NS = "persistent://public/default/"


def shortened_spelling(local: str) -> str:
    """The directory name a long topic part gets: a short topic can spell it literally."""
    enc = quote(local, safe="-_=:").replace(".", "%2E")
    return enc[:150] + "~" + hashlib.sha1(local.encode()).hexdigest()[:16]


LONG = "a" * 260
SHORT = shortened_spelling(LONG)  # 167 characters of legal topic name


def test_short_name_spelling_a_shortened_one_maps_elsewhere():
    assert len(SHORT) == 167
    long_dir, short_dir = topic_relpath(NS + LONG), topic_relpath(NS + SHORT)
    assert long_dir != short_dir
    # the long name's directory is what it always was (existing data directories still open)
    assert long_dir.endswith("/" + SHORT)
    assert short_dir.endswith("/" + SHORT.replace("~", "%7E"))


@pytest.mark.parametrize(
    "local",
    [
        "t",
        "with~tilde",
        "~",
        "x" * 200,
        "x" * 201,
        "caf\u00e9.\u00fc",
        "a%7Eb",  # a name spelling the escape itself
        "b" * 150 + "~" + "0" * 16,
        "b" * 150 + "~" + "0" * 15,
        "~" * 167,
    ],
)
def test_names_that_never_collided_keep_their_directory_or_stay_distinct(local):
    rel = topic_relpath(NS + local)
    enc = quote(local, safe="-_=:").replace(".", "%2E")
    shaped = len(enc) == 167 and enc[150] == "~" and all(c in "0123456789abcdef" for c in enc[151:])
    if len(enc) <= 200 and not shaped:
        assert rel.endswith("/" + enc)  # unchanged mapping
    assert all(len(p) <= 200 for p in rel.split("/"))


def test_mapping_is_injective_over_tricky_names():
    names = [
        LONG,
        SHORT,
        SHORT.replace("~", "%7E"),
        SHORT.replace("~", "%257E"),
        "~" * 167,
        "~" * 150 + "~" + "a" * 16,
        "a%7E",
        "a~",
        "a.b",
        "a%2Eb",
    ]
    rels = [topic_relpath(NS + n) for n in names]
    assert len(set(rels)) == len(names)


def test_dot_and_dotdot_are_not_topic_names():
    from compactmq.errors import InvalidTopicName
    from compactmq.naming import TopicName

    for bad in (".", "..", "persistent://public/default/..", "persistent://./default/t", "public/../t"):
        with pytest.raises(InvalidTopicName):
            TopicName.parse(bad)


def test_opening_the_colliding_short_name_keeps_the_long_topics_ledgers(open_storage):
    st = open_storage()
    long_ml = st.open_managed_ledger(NS + LONG)
    for i in range(3):
        long_ml.append(f"m{i}".encode())
    long_ml.rollover()
    long_dir = st.topic_dir(NS + LONG)
    before = sorted(os.listdir(long_dir))
    assert any(n.endswith(".log") for n in before)

    st.open_managed_ledger(NS + SHORT).append(b"short")  # a directory of its own
    assert sorted(os.listdir(long_dir)) == before
    assert read_owner(long_dir) == NS + LONG
    assert read_owner(st.topic_dir(NS + SHORT)) == NS + SHORT


def test_a_directory_owned_by_another_topic_is_refused_and_untouched(open_storage, clock):
    st = open_storage()
    owner = st.open_managed_ledger(NS + "owner")
    owner.append(b"keep me")
    owner.rollover()
    directory = st.topic_dir(NS + "owner")
    stray = os.path.join(directory, "999999999999.log")  # unknown to both: an orphan by the old rule
    open(stray, "wb").close()
    before = sorted(os.listdir(directory))
    # another topic pointed at this directory (a hash collision, or a mapping bug) must not open
    with pytest.raises(StorageError, match="belongs to topic persistent://public/default/owner"):
        ManagedLedger(NS + "intruder", directory, st.topic_metadata, load_config(), clock)
    assert sorted(os.listdir(directory)) == before


def test_storage_refuses_a_new_topic_whose_directory_is_owned(open_storage):
    st = open_storage()
    directory = st.topic_dir(NS + "second")
    os.makedirs(directory)
    with open(os.path.join(directory, OWNER_FILE), "w") as f:  # as if "first" had made it
        f.write(NS + "first\n")
    open(os.path.join(directory, "000000000007.log"), "wb").close()
    with pytest.raises(StorageError, match="belongs to topic persistent://public/default/first"):
        st.open_managed_ledger(NS + "second")
    assert not st.topic_metadata.topic_exists(NS + "second")  # refused before anything was recorded
    assert sorted(os.listdir(directory)) == ["000000000007.log", OWNER_FILE]


def test_legacy_directory_without_owner_is_adopted(open_storage):
    st = open_storage()
    ml = st.open_managed_ledger(NS + "legacy")
    ml.append(b"x")
    st.close()
    os.unlink(os.path.join(st.topic_dir(NS + "legacy"), OWNER_FILE))
    st2 = open_storage()
    assert st2.open_managed_ledger(NS + "legacy").read_entry is not None
    assert read_owner(st2.topic_dir(NS + "legacy")) == NS + "legacy"
