"""A user compaction strategy for the tests (pickled by value into Spark's Python workers)."""


class LongestPayloadWins:
    def should_keep_left(self, prev, cur):
        return len(prev.payload) > len(cur.payload)
