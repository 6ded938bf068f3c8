"""Options of the ``compactmq`` format: names, aliases, offsets, times and ``pulsar.client.*``
(plain Python: no Spark, no broker)."""

from __future__ import annotations

import pulsar
import pytest

from compactmq.errors import InvalidConfiguration
from compactmq.spark.messages import serialize_message_id
from compactmq.spark.options import admin_headers, auth_params, client_kwargs, parse_read_options

T = "persistent://public/default/t"
BASE = {"service.url": "pulsar://h:6650"}


def test_kafka_aliases_and_defaults():
    o = parse_read_options(
        {
            **BASE,
            "subscribe": "t, u",
            "startingTimestamp": "1000",
            "endingTimestamp": "2026-01-01T00:00:00",
            "minPartitions": "8",
            "maxRecordsPerPartition": "500",
        }
    )
    assert o.topics == (T, "persistent://public/default/u")
    assert (o.starting_time, o.ending_time) == (1000, 1767225600000)
    assert (o.min_partitions, o.max_records_per_partition) == (8, 500)
    assert (o.view, o.starting, o.ending, o.fail_on_data_loss) == ("raw", "earliest", "latest", True)
    assert parse_read_options({**BASE, "subscribePattern": "t.*"}).topics_pattern == "t.*"
    assert parse_read_options({**BASE, "topic": "t"}, streaming=True).starting == "latest"
    # the streaming cap under both names (Kafka's maxOffsetsPerTrigger, our maxRecordsPerTrigger)
    for name in ("maxOffsetsPerTrigger", "maxRecordsPerTrigger"):
        assert (
            parse_read_options({**BASE, "topic": "t", name: "25"}, streaming=True).max_offsets_per_trigger
            == 25
        )
    assert parse_read_options({**BASE, "topic": "t"}, streaming=True).max_offsets_per_trigger == 0


@pytest.mark.parametrize(
    "options,message",
    [
        ({"topic": "t", "topics": "u"}, "exactly one"),
        ({}, "exactly one"),
        ({"topic": "a,b"}, "use topics"),
        ({"topic": "t", "view": "newest"}, "raw, compacted or latest"),
        ({"topic": "t", "startingOffsets": "{bad"}, "JSON"),
        ({"topic": "t", "startingOffsets": '{"t": "x:y"}'}, "not a message id"),
        ({"topic": "t", "endingOffsets": "earliest"}, "reads nothing"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "true or false"),
        ({"topic": "t", "minPartitions": "-1"}, ">= 0"),
        ({"topic": "t", "startingTime": "yesterday"}, "ISO-8601"),
        ({"topic": "t", "topicsPattern": "("}, "topicsPattern"),
        ({"topic": "t", "topics": "t", "subscribe": "u"}, "exactly one|conflicts"),
        ({"topic": "t", "maxOffsetsPerTrigger": "5", "maxRecordsPerTrigger": "6"}, "maxRecordsPerTrigger"),
    ],
)
def test_bad_options_are_one_clear_line(options, message):
    with pytest.raises(InvalidConfiguration, match=message):
        parse_read_options({**BASE, **options})


def test_offsets_in_every_spelling():
    raw = list(serialize_message_id(7, 3, 2))
    raw = [b - 256 if b > 127 else b for b in raw]  # pulsar-spark writes Java's signed bytes
    o = parse_read_options(
        {
            **BASE,
            "topics": "a,b,c",
            "startingOffsets": '{"a": "7:3", "b": {"ledgerId": 7, "entryId": 3, "batchIndex": 1}, "c": '
            + str(raw)
            + "}",
        }
    )
    ns = "persistent://public/default/"
    assert o.topic_offset("start", ns + "a") == (7, 3, -1)
    assert o.topic_offset("start", ns + "b") == (7, 3, 1)
    assert o.topic_offset("start", ns + "c") == (7, 3, 2)
    assert o.topic_offset("end", ns + "a") == "latest"
    # a partition falls back to its partitioned topic's entry
    assert o.topic_offset("start", ns + "a-partition-1", ns + "a") == (7, 3, -1)


def test_pulsar_client_pass_through():
    kw = client_kwargs(
        {
            "authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "authParams": "token:abc",
            "tlsTrustCertsFilePath": "/ca.pem",
            "tlsAllowInsecureConnection": "false",
            "operationTimeoutMs": "5000",
        }
    )
    assert isinstance(kw["authentication"], pulsar.AuthenticationToken)
    assert kw["tls_trust_certs_file_path"] == "/ca.pem"
    assert kw["tls_allow_insecure_connection"] is False
    assert kw["operation_timeout_seconds"] == 5
    with pytest.raises(InvalidConfiguration, match="not supported"):
        client_kwargs({"noSuchSetting": "1"})
    assert admin_headers({"authPluginClassName": "token", "authParams": "token:abc"}) == {
        "Authorization": "Bearer abc"
    }
    assert admin_headers({"authPluginClassName": "basic", "authParams": '{"userId":"u","password":"p"}'}) == {
        "Authorization": "Basic dTpw"
    }


def test_auth_params_in_the_java_clients_forms():
    assert auth_params('{"userId": "u", "password": "p"}') == {"userId": "u", "password": "p"}
    assert auth_params("tlsCertFile:/c.pem,tlsKeyFile:/k.pem") == {
        "tlsCertFile": "/c.pem",
        "tlsKeyFile": "/k.pem",
    }
    assert auth_params("") == {}
    basic = "org.apache.pulsar.client.impl.auth.AuthenticationBasic"
    for params in ('{"userId":"u","password":"p"}', "userId:u,password:p", '{"username":"u","password":"p"}'):
        kw = client_kwargs({"authPluginClassName": basic, "authParams": params})
        assert isinstance(kw["authentication"], pulsar.AuthenticationBasic)
        assert admin_headers({"authPluginClassName": basic, "authParams": params}) == {
            "Authorization": "Basic dTpw"
        }
    tls = "org.apache.pulsar.client.impl.auth.AuthenticationTls"
    kw = client_kwargs({"authPluginClassName": tls, "authParams": "tlsCertFile:/c.pem,tlsKeyFile:/k.pem"})
    assert isinstance(kw["authentication"], pulsar.AuthenticationTLS)
    assert admin_headers({"authPluginClassName": tls, "authParams": "tlsCertFile:/c,tlsKeyFile:/k"}) == {}
    for plugin, params, message in [
        (basic, '{"userId": "u"}', "basic auth needs"),
        (basic, "{not json", "not valid JSON"),
        (basic, '["u", "p"]', "must be a JSON object"),
        (tls, "tlsCertFile:/c.pem", "TLS auth needs tlsCertFile"),
        (tls, "just-a-path", "key:value pairs"),
    ]:
        with pytest.raises(InvalidConfiguration, match=message):
            client_kwargs({"authPluginClassName": plugin, "authParams": params})
