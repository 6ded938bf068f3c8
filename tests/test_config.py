import pytest

from compactmq.config import load_config, parse_override
from compactmq.errors import InvalidConfiguration


def test_layers_merge_in_order(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# comment\nbrokerServicePort=7001\nwebServicePort = 9001\nspark.driver.memory=2g\n")
    cfg = load_config(conf, {"webServicePort": "9002", "allowAutoTopicCreation": "false"})
    assert cfg["brokerServicePort"] == 7001
    assert cfg["webServicePort"] == 9002
    assert cfg["allowAutoTopicCreation"] is False
    assert cfg.spark["spark.driver.memory"] == "2g"
    assert cfg.spark["spark.master"] == "local[*]"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"noSuchKey": "1"}, "unknown config key 'noSuchKey'"),
        ({"brokerServicePort": "six"}, "expected an integer"),
        ({"topicCompactionRetainNullKey": "maybe"}, "expected true or false"),
    ],
)
def test_bad_config_is_one_line_error(overrides, message):
    with pytest.raises(InvalidConfiguration, match=message) as info:
        load_config(overrides=overrides)
    assert "\n" not in str(info.value)


def test_bad_file_lines_and_missing_file(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("justakey\n")
    with pytest.raises(InvalidConfiguration, match="broker.conf:1"):
        load_config(conf)
    with pytest.raises(InvalidConfiguration, match="cannot read config file"):
        load_config(tmp_path / "missing.conf")


def test_parse_override():
    assert parse_override("a=b=c") == ("a", "b=c")
    with pytest.raises(InvalidConfiguration):
        parse_override("novalue")


def test_offload_keys_have_pulsars_names_and_defaults():
    from compactmq.config import load_config

    cfg = load_config(None, {"managedLedgerOffloadDriver": "aws-s3", "managedLedgerOffloadDeletionLagMs": "0"})
    assert cfg["managedLedgerOffloadDriver"] == "aws-s3"
    assert cfg["managedLedgerOffloadDeletionLagMs"] == 0
    assert cfg["s3ManagedLedgerOffloadMaxBlockSizeInBytes"] == 64 * 1024 * 1024
    assert cfg["s3ManagedLedgerOffloadReadBufferSizeInBytes"] == 1024 * 1024
    assert cfg["managedLedgerOffloadAutoTriggerSizeThresholdBytes"] == -1
    assert cfg["managedLedgerOffloadThresholdInSeconds"] == -1
    for key in ("s3ManagedLedgerOffloadBucket", "s3ManagedLedgerOffloadRegion",
                "s3ManagedLedgerOffloadServiceEndpoint", "fileSystemURI"):
        assert cfg[key] == ""
