"""Compaction where the data is: ``compactmq compact-topic --spark-master spark://...`` on a real
Spark standalone cluster (master and worker started with the ``spark-class`` launcher that ships
in the pyspark package, in directories of their own), for a topic whose sealed ledgers were offloaded
to an S3-compatible store (moto's server on 127.0.0.1) and deleted from the broker's disk, while
the broker keeps running and writing its current ledger: the job has the broker seal it first (a
request in the metadata store), then its tasks read the offloaded entries from the object store
through pyarrow.fs; the broker serves the new view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

from admin.harness import Http, start_broker, topic_path, web_url  # noqa: E402
from admin.test_offload_rest import ledger_files, read_all, wait_until  # noqa: E402
from broker.conftest import make_client  # noqa: E402
import children  # noqa: E402  (tests/ is on sys.path)
from ports import listen_ports  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROOT = Path(__file__).resolve().parents[2]


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


class SparkDaemon:
    """One ``spark-class`` JVM (master or worker) in its own working directory."""

    def __init__(self, workdir: Path, args: list[str], ready: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "daemon.log"
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            # python workers of the executors import this checkout's compactmq
            "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
            # no REST submission server (a fixed port, 6066, shared machine)
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false",
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        }
        self.proc = subprocess.Popen(
            [spark_class(), *args],
            **children.keep(
                cwd=workdir,
                env=env,
                stdout=open(self.log, "ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
        )
        wait_until(
            lambda: (
                self.proc.poll() is None
                and ready in self.log.read_text()
                or (self.proc.poll() is not None and pytest.fail(self.log.read_text()[-3000:]))
            ),
            120,
            what=f"spark {args[0]} ready",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def spark_cluster(tmp_path):
    # the master's JVM binds its port seconds after the pick: from below the ephemeral range
    port, master_ui, worker_ui = listen_ports(3)
    master = SparkDaemon(
        tmp_path / "spark-master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(master_ui),
        ],
        "I have been elected leader",
    )
    worker_dir = tmp_path / "spark-worker"
    try:
        worker = SparkDaemon(
            worker_dir,
            [
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(worker_dir / "work"),
            ],
            "Successfully registered with master",
        )
    except BaseException:
        master.stop()
        raise
    yield f"spark://127.0.0.1:{port}", worker_dir / "work"
    worker.stop()
    master.stop()


def produce(broker, topic: str) -> dict[str, bytes]:
    """Keyed messages, some keys deleted with a tombstone; returns the expected compacted view."""
    c = make_client(broker.url)
    latest: dict[str, bytes] = {}
    try:
        p = c.create_producer(
            topic, batching_enabled=True, batching_max_publish_delay_ms=2, batching_max_messages=10
        )
        for i in range(600):
            key = f"k{(i * 7) % 23}"
            value = b"" if i % 97 == 5 else f"v{i}-".encode() * (1 + i % 4)
            p.send_async(value, None, partition_key=key)
            latest.pop(key, None)
            if value:
                latest[key] = value
        p.flush()
        p.close()
    finally:
        c.close()
    return latest


def test_compact_topic_on_a_standalone_cluster_reads_offloaded_ledgers(tmp_path, s3_server, spark_cluster):
    master_url, worker_work = spark_cluster
    bucket = s3_server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    (tmp_path / "broker").mkdir()
    broker = start_broker(
        tmp_path / "broker" / "data",
        managedLedgerMaxEntriesPerLedger="15",
        retentionCheckIntervalInSeconds="1",
        managedLedgerOffloadDeletionLagMs="0",
        defaultRetentionTimeInMinutes="-1",
        defaultRetentionSizeInMB="-1",
        **s3_server.offload_config(bucket),
    )
    try:
        http = Http(web_url(broker))
        topic = "persistent://public/default/cluster-offloaded"
        tp = topic_path(topic)
        latest = produce(broker, topic)
        # one message more, alone in its entry: the ledger being written is never empty here
        c = make_client(broker.url)
        try:
            p = c.create_producer(topic, batching_enabled=False)
            p.send(b"written-last", partition_key="k-last")
            latest["k-last"] = b"written-last"
        finally:
            c.close()
        stats = http.ok("GET", tp + "/internalStats")
        current = stats["ledgers"][-1]
        # the broker is still writing its current ledger: the job has to have it sealed
        assert current["entries"] > 0, stats["ledgers"]
        http.ok("PUT", tp + "/offload", {"ledgerId": current["ledgerId"], "entryId": 0})
        wait_until(
            lambda: http.ok("GET", tp + "/offload")["status"] == "SUCCESS", 120, what="offload SUCCESS"
        )
        wait_until(
            lambda: all(
                led["localCopyDeleted"] for led in http.ok("GET", tp + "/internalStats")["ledgers"][:-1]
            ),
            what="local copies deleted",
        )
        # of the topic's data only the ledger being written is left on the broker's disk
        assert len(ledger_files(broker, topic)) == 1
        assert len(s3_server.keys(bucket)) == 2 * (len(stats["ledgers"]) - 1)

        job_dir = tmp_path / "job"  # the job's working directory is not the broker's
        job_dir.mkdir()
        t0 = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "compactmq.cli.main",
            "compact-topic",
            "--topic",
            topic,
            "--data-dir",
            str(broker.data_dir),
            "--spark-master",
            master_url,
            "--quiet",
        ]
        for kv in (
            "spark.ui.enabled=false",
            "spark.driver.host=127.0.0.1",
            "spark.driver.memory=1g",
            "spark.executor.memory=512m",
            "spark.cores.max=2",
            "spark.sql.shuffle.partitions=4",
            f"spark.executorEnv.PYTHONPATH={SRC}",
            "spark.app.name=compactmq-cluster-test",
        ):
            cmd += ["--config-override", kv]
        # the job reads the broker's offload settings (as it would from the same broker.conf):
        # its executors then upload the new compacted ledger's parts straight to the store
        for k, v in s3_server.offload_config(bucket).items():
            cmd += ["--config-override", f"{k}={v}"]
        env = {**os.environ, "PYTHONPATH": SRC, "SPARK_LOCAL_IP": "127.0.0.1"}
        proc = subprocess.run(cmd, cwd=job_dir, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout, proc.stderr[-4000:])
        assert "compacted ledger" in proc.stdout, proc.stdout
        elapsed = time.monotonic() - t0

        # the running broker sealed its current ledger when the job asked (no restart), so the
        # run read the messages written last too (the expected view below depends on them)
        after = http.ok("GET", tp + "/internalStats")["ledgers"]
        sealed = next(led for led in after if led["ledgerId"] == current["ledgerId"])
        assert sealed["entries"] == current["entries"] and after[-1]["ledgerId"] > current["ledgerId"]
        assert "did not seal" not in proc.stderr
        # the tasks ran in the worker's executors (their logs are in the worker's work dir)
        app_dirs = list(worker_work.glob("app-*"))
        assert app_dirs and list(app_dirs[0].glob("*/stderr")), list(worker_work.rglob("*"))[:20]

        view = http.ok("GET", tp + "/internalStats")["compactedLedger"]
        assert view["offloaded"] and view["localCopyDeleted"], view  # never on the broker's disk
        # the view lives in the store as a chain: its manifest names its segments (object_chain)
        keys = s3_server.keys(bucket)
        assert any(k.endswith(f"{view['ledgerId']:012d}.chain") for k in keys), keys
        compacted = read_all(broker, topic, compacted=True)
        assert {k: v for k, v, _ in compacted} == latest
        assert [k for k, _, _ in compacted] == list(latest)  # in id order: the order of their last write
        print(f"compact-topic on the cluster: {elapsed:.1f}s")
    finally:
        broker.stop()
