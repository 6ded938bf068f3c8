"""resolve_layout: which of a ledger's objects make up its bytes (no store needed)."""

from compactmq.storage.object_layout import resolve_layout


def f(start: int, end: int, epoch: int = 0) -> str:
    return f"f-{start:016d}-{end:016d}-e{epoch:010d}"


def m(size: int, epoch: int = 0) -> str:
    return f"m-{size:016d}-e{epoch:010d}"


def test_flush_objects_chain_from_zero_and_a_gap_ends_the_ledger():
    objects = {f(0, 24): 24, f(24, 100): 76, f(100, 150): 50, f(200, 250): 50, "index": 9}
    layout, unused = resolve_layout(objects)
    assert [p[:2] for p in layout.parts] == [(0, 24), (24, 100), (100, 150)] and not layout.merged
    assert layout.end == 150 and unused == [f(200, 250)]


def test_an_object_whose_size_disagrees_with_its_name_is_never_used():
    layout, unused = resolve_layout({f(0, 24): 24, f(24, 100): 40})  # cut short
    assert layout.end == 24 and unused == [f(24, 100)]
    layout, unused = resolve_layout({m(150): 90, f(0, 24): 24})
    assert not layout.merged and unused == [m(150)]


def test_a_merged_object_is_the_ledger_highest_epoch_then_shortest():
    objects = {f(0, 24): 24, f(24, 100): 76, m(100): 100, m(80): 80, m(100, epoch=2): 100, "index": 9}
    layout, unused = resolve_layout(objects)
    assert layout.merged and layout.parts == [(0, 100, m(100, epoch=2))]
    assert sorted(unused) == sorted([f(0, 24), f(24, 100), m(100), m(80)])
    layout, _ = resolve_layout({m(100): 100, m(80): 80})  # a cut that crashed before its deletes
    assert layout.end == 80


def test_at_one_offset_the_highest_epoch_wins():
    layout, unused = resolve_layout({f(0, 24): 24, f(24, 60, 1): 36, f(24, 90, 3): 66})
    assert layout.parts[-1] == (24, 90, f(24, 90, 3)) and unused == [f(24, 60, 1)]


def test_no_objects_no_ledger():
    layout, unused = resolve_layout({"index": 3, "stray": 1})
    assert layout.parts == [] and layout.end == 0 and sorted(unused) == ["stray"]
