import pytest

from .helpers import produce, read_all, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_smoke(cmq_spark, broker, client, topic):
    items = [(f"k{i % 5}", f"v{i}".encode()) for i in range(40)]
    produce(client, topic, items, batching=True)
    expected = sorted(read_all(client, topic), key=lambda x: x[2:])
    df = cmq_spark.read.format("compactmq").option("topic", topic).load(str(broker.data_dir))
    df.printSchema()
    assert rows_of(df) == expected
    df2 = (
        cmq_spark.read.format("compactmq")
        .option("topic", topic)
        .option("service.url", broker.url)
        .option("admin.url", f"http://127.0.0.1:{broker.web_port}")
        .load()
    )
    assert rows_of(df2) == expected
