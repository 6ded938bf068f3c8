#!/usr/bin/env bash
# A cluster on one machine to try: ZooKeeper and three brokers sharing it (broker.cluster).
#
#   scripts/cluster.sh start [DIR]   start them (DIR defaults to ./cluster), print the URLs, return
#                                    once every broker is ready; DIR/cluster.json lists each process
#                                    (role, pid, URLs)
#   scripts/cluster.sh stop [DIR]    stop the brokers (SIGTERM: each hands its bundles back first),
#                                    then ZooKeeper
#
# Ports (override with the environment): ZK_PORT=2181, BROKER_PORTS="6650 6660 6670",
# WEB_PORTS="8080 8090 8100". ZooKeeper is Debian's package (scripts/setup.sh installs it) or the
# jar(s) ZOOKEEPER_JAR names. Ledgers stay on each broker's disk in this step: a topic's data does
# not follow its bundle to another broker yet.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"
dir="$(mkdir -p "${2:-$PWD/cluster}" && cd "${2:-$PWD/cluster}" && pwd)"
zk_port="${ZK_PORT:-2181}"
read -r -a broker_ports <<< "${BROKER_PORTS:-6650 6660 6670}"
read -r -a web_ports <<< "${WEB_PORTS:-8080 8090 8100}"
compactmq="${COMPACTMQ:-$root/.venv/bin/compactmq}"

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

start_broker() {  # index
    local i="$1" log="$dir/broker$1.log"
    : > "$log"
    nohup "$compactmq" standalone --data-dir "$dir/broker$i" \
        --broker-port "${broker_ports[$i]}" --web-port "${web_ports[$i]}" \
        --config-override "metadataStoreUrl=zk:127.0.0.1:$zk_port/compactmq" \
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
        start_zookeeper
        for i in 0 1 2; do start_broker "$i"; done
        for i in 0 1 2; do wait_ready "$i"; done
        write_json
        say "ZooKeeper: 127.0.0.1:$zk_port"
        for i in 0 1 2; do say "broker $i: pulsar://127.0.0.1:${broker_ports[$i]}  http://127.0.0.1:${web_ports[$i]}"; done
        say "service URL: $(grep -o 'pulsar://[0-9.:,]*' "$dir/cluster.json" | tail -1)  (details: $dir/cluster.json)"
        ;;
    stop)
        for i in 0 1 2; do stop_pid "$dir/broker$i.pid" TERM; done
        stop_pid "$dir/zookeeper.pid" TERM
        say "stopped"
        ;;
    *)
        echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
