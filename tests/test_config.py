import pytest

from compactmq.config import (
    SETTINGS,
    bool_setting,
    config_list,
    describe_unknown_keys,
    float_setting,
    int_setting,
    load_config,
    parse_override,
    setting,
    suggest_key,
)
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


PULSAR_STYLE_CONF = """\
### --- General broker settings --- ###
metadataStoreUrl=
brokerServicePort=6650
brokerServicePortTls=
webServicePort=8080
bindAddress=127.0.0.1
clusterName=standalone
managedLedgerCacheSizeMB=
maxUnackedMessagesPerSubscriptionOnBrokerBlocked=0.16
bookkeeperClientTimeoutInSeconds=30
bookkeeperSomeSettingOfANewerRelease=1
loadBalancerEnabled=false
zookeeperServers=
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken, \
org.apache.pulsar.broker.authentication.AuthenticationProviderTls
superUserRoles=admin,  ops ,
tokenAuthClaim=
tokenSecretKey=data:;base64,c2VjcmV0
"""


def test_pulsar_conf_accepted_with_ignored_keys_reported(tmp_path):
    conf = tmp_path / "standalone.conf"
    conf.write_text(PULSAR_STYLE_CONF.replace("\\\n", ""))
    cfg = load_config(conf, {"functionsWorkerEnabled": "false"})
    # implemented keys take effect; empty values mean the default
    assert cfg["authenticationEnabled"] is True
    assert cfg["managedLedgerCacheSizeMB"] == 256
    assert cfg["tokenAuthClaim"] == "sub"
    assert cfg["brokerServicePortTls"] is None
    assert config_list(cfg, "superUserRoles") == ["admin", "ops"]
    assert config_list(cfg, "authenticationProviders")[1].endswith("AuthenticationProviderTls")
    # parts we do not have: accepted, listed once in the order seen (prefix match for new names)
    # the metadata store keys are declared (an empty URL means the embedded store)
    assert cfg["metadataStoreUrl"] == "" and cfg["metadataStoreSessionTimeoutMillis"] == 30000
    # the cluster keys are declared too (broker.cluster)
    assert cfg["clusterName"] == "standalone" and cfg["loadBalancerEnabled"] is False
    assert cfg.ignored_keys == (
        "maxUnackedMessagesPerSubscriptionOnBrokerBlocked",
        "bookkeeperClientTimeoutInSeconds",
        "bookkeeperSomeSettingOfANewerRelease",
        "zookeeperServers",
        "functionsWorkerEnabled",
    )
    assert cfg.unknown_keys == ()


def test_unknown_keys_never_stop_the_broker_and_near_misses_get_a_suggestion(tmp_path):
    """Pulsar ignores keys it does not know; a typo of a key that would have taken effect is
    reported with the key it probably meant."""
    conf = tmp_path / "standalone.conf"
    conf.write_text(
        PULSAR_STYLE_CONF.replace("\\\n", "")
        + "authenticationEnable=true\nsomeKeyOfAFutureRelease=1\nauthenticationEnable=false\n"
    )
    cfg = load_config(conf, {"BrokerServicePort": "7000", "managedLedgerMaxEntriesPerLedgr": "5"})
    assert cfg.unknown_keys == (
        "authenticationEnable",
        "someKeyOfAFutureRelease",
        "BrokerServicePort",
        "managedLedgerMaxEntriesPerLedgr",
    )
    assert cfg["brokerServicePort"] == 6650 and cfg["managedLedgerMaxEntriesPerLedger"] == 50000
    assert describe_unknown_keys(cfg.unknown_keys) == (
        "authenticationEnable (did you mean authenticationEnabled?), someKeyOfAFutureRelease, "
        "BrokerServicePort (did you mean brokerServicePort?), "
        "managedLedgerMaxEntriesPerLedgr (did you mean managedLedgerMaxEntriesPerLedger?)"
    )
    # with_overrides keeps both lists and adds to them
    more = cfg.with_overrides({"superUserRole": "x"})
    assert more.unknown_keys[-1] == "superUserRole" and more.ignored_keys == cfg.ignored_keys
    assert suggest_key("superUserRole") == "superUserRoles"
    assert suggest_key("zzz") is None


def test_security_defaults_are_pulsars():
    cfg = load_config()
    assert cfg["authenticationEnabled"] is False and cfg["authorizationEnabled"] is False
    assert cfg["authenticationRefreshCheckSeconds"] == 60
    assert cfg["tokenPublicAlg"] == "RS256" and cfg["tokenAuthClaim"] == "sub"
    assert cfg["tokenAllowedClockSkewSeconds"] == 0
    # unset: follows authenticationEnabled (stricter than Pulsar's false), see metrics_need_authentication
    assert cfg["authenticateMetricsEndpoint"] is None
    assert cfg["brokerServicePortTls"] is None and cfg["webServicePortTls"] is None
    assert cfg.ignored_keys == ()
    assert config_list(cfg, "superUserRoles") == []


def test_tls_ports_and_deprecated_tls_enabled():
    assert load_config(overrides={"brokerServicePortTls": "0"})["brokerServicePortTls"] == 0
    with pytest.raises(InvalidConfiguration, match="brokerServicePortTls.*expected an integer"):
        load_config(overrides={"brokerServicePortTls": "tls"})
    cfg = load_config(overrides={"tlsEnabled": "true"})
    assert (cfg["brokerServicePortTls"], cfg["webServicePortTls"]) == (6651, 8443)
    cfg = load_config(overrides={"tlsEnabled": "true", "brokerServicePortTls": "7651"})
    assert (cfg["brokerServicePortTls"], cfg["webServicePortTls"]) == (7651, None)


def test_secrets_are_not_in_repr():
    cfg = load_config(overrides={"tokenSecretKey": "data:;base64,c3VwZXJzZWNyZXQ=", "basicAuthConf": "x"})
    assert "c3VwZXJzZWNyZXQ" not in repr(cfg) and "'basicAuthConf': '***'" in repr(cfg)


def test_offload_keys_have_pulsars_names_and_defaults():
    from compactmq.config import load_config

    cfg = load_config(
        None, {"managedLedgerOffloadDriver": "aws-s3", "managedLedgerOffloadDeletionLagMs": "0"}
    )
    assert cfg["managedLedgerOffloadDriver"] == "aws-s3"
    assert cfg["managedLedgerOffloadDeletionLagMs"] == 0
    assert cfg["s3ManagedLedgerOffloadMaxBlockSizeInBytes"] == 64 * 1024 * 1024
    assert cfg["s3ManagedLedgerOffloadReadBufferSizeInBytes"] == 1024 * 1024
    assert cfg["managedLedgerOffloadAutoTriggerSizeThresholdBytes"] == -1
    assert cfg["managedLedgerOffloadThresholdInSeconds"] == -1
    for key in (
        "s3ManagedLedgerOffloadBucket",
        "s3ManagedLedgerOffloadRegion",
        "s3ManagedLedgerOffloadServiceEndpoint",
        "fileSystemURI",
    ):
        assert cfg[key] == ""


def test_setting_reads_the_declared_default_when_unset():
    # a plain dict (as unit tests pass) falls back to the one declared default
    assert (
        int_setting({}, "maxUnackedMessagesPerConsumer") == SETTINGS["maxUnackedMessagesPerConsumer"].default
    )
    assert int_setting({}, "maxUnackedMessagesPerConsumer") == 50000  # Pulsar's default
    assert float_setting({}, "compactionChainMaxStaleRatio") == 0.25
    assert bool_setting({}, "authorizationEnabled") is False
    assert setting({}, "topicCompactionStrategy") == SETTINGS["topicCompactionStrategy"].default
    # a value that is set wins, in a dict or a loaded Config
    assert int_setting({"maxProducersPerTopic": "3"}, "maxProducersPerTopic") == 3
    assert bool_setting({"authorizationEnabled": "true"}, "authorizationEnabled") is True
    cfg = load_config(None, {"compactionChainMaxStaleRatio": "0.5", "maxProducersPerTopic": "7"})
    assert float_setting(cfg, "compactionChainMaxStaleRatio") == 0.5
    assert int_setting(cfg, "maxProducersPerTopic") == 7


def test_setting_refuses_an_undeclared_key_and_a_wrong_type():
    with pytest.raises(KeyError, match="maxProducersPerTopik"):
        setting({"maxProducersPerTopik": 1}, "maxProducersPerTopik")
    with pytest.raises(KeyError, match="nope"):
        int_setting({}, "nope")
    with pytest.raises(TypeError, match="authorizationEnabled"):
        int_setting({}, "authorizationEnabled")
    with pytest.raises(TypeError, match="maxProducersPerTopic"):
        bool_setting({}, "maxProducersPerTopic")


def test_a_number_setting_is_coerced_when_loaded():
    cfg = load_config(None, {"managedLedgerDefaultMarkDeleteRateLimit": " 2.5 "})
    assert cfg["managedLedgerDefaultMarkDeleteRateLimit"] == 2.5
    with pytest.raises(InvalidConfiguration, match="expected a number"):
        load_config(None, {"compactionChainMaxStaleRatio": "lots"})


def test_every_setting_read_in_src_names_a_declared_key_of_its_type():
    """A typo in a key read through setting()/int_setting()/... fails here, before any run."""
    import ast
    from pathlib import Path

    import compactmq

    wanted = {"setting": None, "int_setting": ("int", "OptionalInt"), "float_setting": ("float", "int")}
    wanted["bool_setting"] = ("bool",)
    seen = 0
    for path in Path(compactmq.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in wanted or len(node.args) != 2:
                continue
            key = node.args[1]
            if not isinstance(key, ast.Constant):
                continue
            seen += 1
            assert key.value in SETTINGS, f"{path}:{node.lineno}: {key.value!r} is not declared"
            types = wanted[node.func.id]
            if types is not None:
                assert SETTINGS[key.value].type.__name__ in types, f"{path}:{node.lineno}: {key.value!r}"
    assert seen >= 20  # the scan found the call sites (it cannot pass by finding none)
