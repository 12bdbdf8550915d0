#!/usr/bin/env bash
# The local stack, every component a real process on loopback:
#   PostgreSQL 15 (source database, Apicurio's storage, the Hive metastore database)
#   MariaDB 10.11 (second source database: binlog ROW/FULL, server_id 1, GTID domain 0), database `source`;
#   local-only logins over TCP 127.0.0.1:$MARIADB_PORT (default 3306): `root`/`mariadb` (all privileges,
#   for tests and setup) and `debezium`/`debezium` (what Debezium's MariaDB connector needs, no more)
#   Kafka 3.9 broker (single-node KRaft)
#   Apicurio Registry 3.0 (SQL storage in the stack's PostgreSQL: it lives and dies with the Kafka data)
#   Kafka Connect 3.9 (distributed, one worker) with the Debezium PostgreSQL and MariaDB connectors, each
#   with the Apicurio converter beside it
#   S3 API: gofakes3 (in memory; built from the Go module proxy by scripts/setup.sh s3), bucket `lake` for Silver, Bronze and
#   checkpoints on s3a://lake/
#   A restart of the S3 server empties the lake and the checkpoints together: the next run of the job reads
#   Kafka from the configured start and rebuilds every table. Kafka, the registry and the databases keep theirs.
#   Spark standalone: a master (spark://127.0.0.1:7077) and two workers (1 core, 2g each) from pip's pyspark, so a
#   job can run with executors in JVMs of their own, as on EMR (tests/e2e/test_standalone.py)
#
# usage: scripts/stack.sh up [service...] | down [service...] | reset | status | unstick CONNECTOR
#   up      install what is missing, start what is not running, wait until each service answers; `up spark`
#           starts one (and installs only what it needs), leaving the others as they are
#   down    stop the processes this script started (by pid), keep their state; `down kafka` stops one
#           (services: postgres mariadb kafka registry connect s3 spark)
#   reset   down, then wipe all state together: Kafka logs, Connect offsets, registry, databases,
#           metastore, lake and checkpoints, the Spark workers' folders
#   status  every endpoint and pid
#   unstick a PostgreSQL connector stuck on its own replication slot (Connect says RUNNING, nothing streams: the
#           slot is held by another backend, e.g. an earlier task's connection): end the backend holding the
#           slot, restart the connector's tasks, wait until the slot is taken again
#
# State, logs and pid files live under $STACK_DIR (default .stack/ in the repository, git-ignored).
# Ports: PG_PORT MARIADB_PORT KAFKA_PORT CONTROLLER_PORT REGISTRY_PORT CONNECT_PORT S3_PORT SPARK_MASTER_PORT
# SPARK_UI_PORT KAFKA_PROXIED_LISTENER_PORT KAFKA_PROXIED_PORT (defaults 5432 3306 9092 9093 8080 8083 9000 7077 8090
# 9094 19094), so a second stack can run beside the first
# with its own STACK_DIR. The Spark workers' RPC and web UI ports are free ones (the master's /json lists them).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
DEPS=$ROOT/.deps
LOGS=$STACK_DIR/logs
PIDS=$STACK_DIR/pids

PG_PORT=${PG_PORT:-5432}
MARIADB_PORT=${MARIADB_PORT:-3306}
KAFKA_PORT=${KAFKA_PORT:-9092}
CONTROLLER_PORT=${CONTROLLER_PORT:-9093}
# A second listener of the broker that advertises a proxy's port: clients that bootstrap through a proxy on
# KAFKA_PROXIED_PORT keep going through it (the outage tests cut one job off the broker, tests/e2e/test_outages.py).
KAFKA_PROXIED_LISTENER_PORT=${KAFKA_PROXIED_LISTENER_PORT:-9094}
KAFKA_PROXIED_PORT=${KAFKA_PROXIED_PORT:-19094}
REGISTRY_PORT=${REGISTRY_PORT:-8080}
CONNECT_PORT=${CONNECT_PORT:-8083}
S3_PORT=${S3_PORT:-9000}
S3_BUCKET=${S3_BUCKET:-lake}
SPARK_MASTER_PORT=${SPARK_MASTER_PORT:-7077}
SPARK_UI_PORT=${SPARK_UI_PORT:-8090}
SPARK_WORKERS=2
SPARK_WORKER_CORES=1
SPARK_WORKER_MEMORY=2g  # what the executors of all apps on one worker may take together
SERVICES=(postgres mariadb kafka registry connect s3 spark)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
# Local-only credentials for the loopback database; production secrets never pass through this script.
export PGPASSWORD=${PGPASSWORD:-postgres}
PG_USER=postgres
MARIADB_ROOT_PASSWORD=mariadb
MARIADB_CDC_USER=debezium
MARIADB_CDC_PASSWORD=debezium
HEAP=${STACK_HEAP:-512m}

log() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

as_postgres() {
  # initdb and postgres refuse to run as root.
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

pg_dir() {
  # PostgreSQL's files must be reachable by the postgres user. When the checkout sits below a directory that
  # user cannot traverse (a mktemp -d clone, a private home), they live in the postgres user's home instead,
  # under a name derived from this stack's directory; `reset` removes them all the same.
  if [ "$(id -u)" != 0 ] || runuser -u postgres -- test -x "$STACK_DIR" 2>/dev/null; then
    echo "$STACK_DIR/pg"
  else
    echo "$(getent passwd postgres | cut -d: -f6)/cdc-stack-$(printf %s "$STACK_DIR" | cksum | cut -d' ' -f1)"
  fi
}

mariadb_dir() {
  # MariaDB's files must be reachable by the mysql user the server runs as under root: the same rule as pg_dir.
  # That user's home is /nonexistent on Debian, so the fallback is a directory of its own below /var/lib.
  if [ "$(id -u)" != 0 ] || runuser -u mysql -- test -x "$STACK_DIR" 2>/dev/null; then
    echo "$STACK_DIR/mariadb"
  else
    echo "/var/lib/cdc-stack-mariadb-$(printf %s "$STACK_DIR" | cksum | cut -d' ' -f1)"
  fi
}

alive() { # alive NAME: the recorded pid runs and is still our server (a stale pid file may name another process)
  local f=$PIDS/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -E 'java|postgres|mariadbd|gofakes3'
}

wait_for() { # wait_for NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    # The pause comes first: right after `cmd &` the pid may still be the forked shell, not yet the server it
    # executes, and `alive` would call a starting server dead (seen with gofakes3, which answers within a second).
    sleep 1
    if ! alive "$name"; then die "$name exited while starting; see $LOGS/$name.log"; fi
    if (( SECONDS - start > secs )); then die "$name not ready after ${secs}s; see $LOGS/$name.log"; fi
  done
  log "$name ready after $((SECONDS - start))s"
}

psql_admin() { "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -v ON_ERROR_STOP=1 -qAt "$@"; }

mariadb_admin() { # SQL as the server's admin over its socket (unix_socket auth: the OS user running this script)
  mariadb --no-defaults --protocol=socket -S "$(mariadb_dir)/run/mariadbd.sock" -u "$(id -un)" -N -B "$@"
}

ensure_installed() { # ensure_installed SERVICE...: the setup steps those services need
  # system: the databases and a JDK; jars: Kafka, Connect with Debezium, the registry; s3: the S3 server
  # (gofakes3); python: Spark (pip's pyspark) runs from the project virtualenv.
  local steps=(system) all=" $* "
  if [[ $all == *" kafka "* || $all == *" registry "* || $all == *" connect "* ]]; then steps+=(jars); fi
  if [[ $all == *" s3 "* ]]; then steps+=(s3); fi
  if [[ $all == *" spark "* ]]; then steps+=(python); fi
  "$ROOT/scripts/setup.sh" "${steps[@]}"
}

start_postgres() {
  local dir data run
  dir=$(pg_dir); data=$dir/data; run=$dir/run
  if alive postgres; then log "postgres already running (pid $(cat "$PIDS/postgres.pid"))"; return; fi
  mkdir -p "$dir" "$run" "$LOGS"
  touch "$dir/postgres.log"
  if [ "$(id -u)" = 0 ]; then chown -R postgres: "$dir"; fi
  [ "$dir/postgres.log" -ef "$LOGS/postgres.log" ] || ln -sfn "$dir/postgres.log" "$LOGS/postgres.log"
  if [ ! -f "$data/PG_VERSION" ]; then
    as_postgres "$PG_BIN/initdb" -D "$data" -U "$PG_USER" --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  as_postgres "$PG_BIN/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$run -c wal_level=logical \
        -c max_wal_senders=30 -c max_replication_slots=30 -c max_connections=200" start >/dev/null
  head -1 "$data/postmaster.pid" > "$PIDS/postgres.pid"
  wait_for postgres 60 psql_admin -d postgres -c 'select 1'
  for db in source registry metastore; do
    if [ -z "$(psql_admin -d postgres -c "select 1 from pg_database where datname='$db'")" ]; then
      psql_admin -d postgres -c "create database $db"
    fi
  done
}

start_mariadb() {
  local dir data run as_root=() socket_user
  dir=$(mariadb_dir); data=$dir/data; run=$dir/run; socket_user=$(id -un)
  if alive mariadb; then log "mariadb already running (pid $(cat "$PIDS/mariadb.pid"))"; return; fi
  mkdir -p "$dir" "$run" "$LOGS"
  # The server's own option file only: Debian's /etc/mysql config (socket, port 3306, datadir) is not read.
  cat > "$dir/my.cnf" <<EOF
[mariadbd]
datadir=$data
socket=$run/mariadbd.sock
pid-file=$run/mariadbd.pid
port=$MARIADB_PORT
bind-address=127.0.0.1
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
# Binlog for Debezium: row events with full before/after images and column metadata, GTIDs in domain 0.
server-id=1
log-bin=mariadb-bin
binlog-format=ROW
binlog-row-image=FULL
binlog-row-metadata=FULL
gtid-domain-id=0
EOF
  if [ "$(id -u)" = 0 ]; then chown -R mysql: "$dir"; as_root=(--user=mysql); socket_user=mysql; fi
  if [ ! -d "$data/mysql" ]; then
    # Admin logins by unix_socket: root@localhost, and the OS user running this script (mysql under root).
    mariadb-install-db --defaults-file="$dir/my.cnf" "${as_root[@]}" --skip-test-db --skip-name-resolve \
      --auth-root-authentication-method=socket --auth-root-socket-user="$socket_user" \
      >> "$LOGS/mariadb.log" 2>&1 || die "mariadb-install-db failed; see $LOGS/mariadb.log"
  fi
  # --user: mariadbd started by root switches to the mysql user itself, so $! is the server's pid.
  nohup /usr/sbin/mariadbd --defaults-file="$dir/my.cnf" "${as_root[@]}" >> "$LOGS/mariadb.log" 2>&1 &
  echo $! > "$PIDS/mariadb.pid"
  wait_for mariadb 60 mariadb_admin -e 'select 1'
  # Idempotent: the database, the connector's login and a TCP admin login (skip-name-resolve: by IP only).
  # Kept out of the binlog, so a restart adds no GTIDs or events a connector would read.
  mariadb_admin -e "
    SET SESSION sql_log_bin = 0;
    CREATE DATABASE IF NOT EXISTS source;
    CREATE USER IF NOT EXISTS '$MARIADB_CDC_USER'@'127.0.0.1' IDENTIFIED BY '$MARIADB_CDC_PASSWORD';
    ALTER USER '$MARIADB_CDC_USER'@'127.0.0.1' IDENTIFIED BY '$MARIADB_CDC_PASSWORD';
    GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, LOCK TABLES
      ON *.* TO '$MARIADB_CDC_USER'@'127.0.0.1';
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';
    ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';
    GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
}

start_kafka() {
  local dir=$STACK_DIR/kafka
  if alive kafka; then log "kafka already running (pid $(cat "$PIDS/kafka.pid"))"; return; fi
  mkdir -p "$dir/data"
  cat > "$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT,PROXIED://127.0.0.1:$KAFKA_PROXIED_LISTENER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,PROXIED://127.0.0.1:$KAFKA_PROXIED_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,PROXIED:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=-1
EOF
  write_log4j "$dir/log4j.properties"
  if [ ! -f "$dir/data/meta.properties" ]; then
    local cluster_id
    cluster_id=$(java -cp "$DEPS/kafka/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
    java -cp "$DEPS/kafka/*" -Dlog4j.configuration="file:$dir/log4j.properties" kafka.tools.StorageTool \
      format -t "$cluster_id" -c "$dir/server.properties" >> "$LOGS/kafka.log" 2>&1
  fi
  local from
  from=$(( $(wc -c < "$LOGS/kafka.log" 2>/dev/null || echo 0) + 1 ))  # only this start's lines count
  nohup java -Xms256m -Xmx"$HEAP" -Dlog4j.configuration="file:$dir/log4j.properties" \
    -cp "$DEPS/kafka/*" kafka.Kafka "$dir/server.properties" >> "$LOGS/kafka.log" 2>&1 &
  echo $! > "$PIDS/kafka.pid"
  wait_for kafka 90 bash -c "tail -c +$from '$LOGS/kafka.log' | grep -q 'Kafka Server started'"
}

write_log4j() {
  cat > "$1" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.org.reflections=ERROR
EOF
}

start_registry() {
  if alive registry; then log "registry already running (pid $(cat "$PIDS/registry.pid"))"; return; fi
  local jar
  jar=$(ls "$DEPS"/registry/apicurio-registry-app-*-runner.jar)
  # SQL storage in the stack's PostgreSQL: content ids survive a registry restart and are wiped with Kafka
  # by `reset`, so an id in a Kafka record always names the schema it was written with.
  nohup java -Xms128m -Xmx"$HEAP" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
    -Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=postgresql \
    -Dapicurio.datasource.url="jdbc:postgresql://127.0.0.1:$PG_PORT/registry" \
    -Dapicurio.datasource.username="$PG_USER" -Dapicurio.datasource.password="$PGPASSWORD" \
    -Dapicurio.datasource.jdbc.initial-size=2 -Dapicurio.datasource.jdbc.min-size=2 \
    -Dapicurio.datasource.jdbc.max-size=10 \
    -jar "$jar" >> "$LOGS/registry.log" 2>&1 &
  echo $! > "$PIDS/registry.pid"
  wait_for registry 120 curl -sf "http://127.0.0.1:$REGISTRY_PORT/apis/registry/v3/system/info"
}

start_s3() {
  if alive s3; then log "s3 already running (pid $(cat "$PIDS/s3.pid"))"; return; fi
  # gofakes3 (scripts/setup.sh s3), objects in memory: its CPU per request is a small part of moto's, which served
  # the stack before and spent about a sixth of a job run's CPU. It takes any access key.
  nohup "$ROOT/.deps/bin/gofakes3" -backend memory -host "127.0.0.1:$S3_PORT" -initialbucket "$S3_BUCKET" -quiet \
    >> "$LOGS/s3.log" 2>&1 &
  echo $! > "$PIDS/s3.pid"
  wait_for s3 60 curl -sf "http://127.0.0.1:$S3_PORT/$S3_BUCKET"
  log "bucket s3a://$S3_BUCKET/ ready"
}

spark_home() { # pip's pyspark: bin/spark-class, jars/, no sbin/start-*.sh (the daemons are started here directly)
  local home
  home=$("$ROOT/.venv/bin/python" "$ROOT/.venv/bin/find_spark_home.py" 2>/dev/null) || true
  [ -d "$home/jars" ] || die "no pyspark in $ROOT/.venv; run scripts/setup.sh python"
  echo "$home"
}

spark_daemon() { # spark_daemon NAME CLASS ARGS...: one Spark daemon JVM in the background, as spark-class runs it
  local name=$1 class=$2 home scala; shift 2
  home=$(spark_home)
  scala=$(ls "$home"/jars/spark-core_*.jar | sed -n 's/.*spark-core_\([0-9.]*\)-.*/\1/p' | head -1)
  # The worker launches executors from SPARK_HOME's jars (and its Scala version, which spark-class would export);
  # SPARK_LOCAL_IP keeps every daemon, executor and web UI on loopback. Workdirs and scratch stay in the stack.
  # The daemons only schedule (the executors they launch get the application's JVM options): a small heap, and the
  # quick-starting client compiler.
  nohup env SPARK_HOME="$home" SPARK_SCALA_VERSION="$scala" SPARK_LOCAL_IP=127.0.0.1 \
    SPARK_LOCAL_DIRS="$STACK_DIR/spark/local" \
    java -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$home/jars/*" "$class" "$@" \
    >> "$LOGS/$name.log" 2>&1 &
  echo $! > "$PIDS/$name.pid"
}

start_spark() {
  local dir=$STACK_DIR/spark i name from=()
  mkdir -p "$dir/local"
  # An executor's folder in its worker's (the jars it fetched, its stdout and stderr) goes 3 hours after the end
  # of its application: the job's jars take about 400 MB per executor.
  cat > "$dir/worker.properties" <<EOF
spark.worker.cleanup.enabled=true
spark.worker.cleanup.interval=600
spark.worker.cleanup.appDataTtl=10800
EOF
  if alive spark-master; then
    log "spark master already running (pid $(cat "$PIDS/spark-master.pid"))"
  else
    spark_daemon spark-master org.apache.spark.deploy.master.Master \
      --host 127.0.0.1 --port "$SPARK_MASTER_PORT" --webui-port "$SPARK_UI_PORT"
    wait_for spark-master 60 curl -sf "http://127.0.0.1:$SPARK_UI_PORT/json"
  fi
  # The workers start together; each registers with the master (and again by itself after a master restart).
  for i in $(seq 1 "$SPARK_WORKERS"); do
    name=spark-worker-$i
    touch "$LOGS/$name.log"
    from[i]=$(( $(wc -c < "$LOGS/$name.log") + 1 ))  # only this start's lines count
    if alive "$name"; then log "$name already running (pid $(cat "$PIDS/$name.pid"))"; from[i]=; continue; fi
    mkdir -p "$dir/$name"
    spark_daemon "$name" org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$SPARK_MASTER_PORT" \
      --host 127.0.0.1 --webui-port 0 --cores "$SPARK_WORKER_CORES" --memory "$SPARK_WORKER_MEMORY" \
      --work-dir "$dir/$name" --properties-file "$dir/worker.properties"
  done
  for i in $(seq 1 "$SPARK_WORKERS"); do
    name=spark-worker-$i
    [ -z "${from[i]}" ] || wait_for "$name" 60 \
      bash -c "tail -c +${from[i]} '$LOGS/$name.log' | grep -q 'Successfully registered with master'"
  done
}

spark_alive() { # the master and every worker
  local i
  alive spark-master || return 1
  for i in $(seq 1 "$SPARK_WORKERS"); do alive "spark-worker-$i" || return 1; done
}

plugin_dir() {
  # One Connect plugin per Debezium connector, each with the Apicurio converter and the project's SMT
  # (io.cdclake.connect.DefaultsAsParameters) beside it (plugin isolation loads the converter and transforms named
  # in a connector config from the connector's own folder).
  local src name
  rm -rf "$STACK_DIR/plugins"
  for src in "$DEPS"/debezium/debezium-connector-postgres "$DEPS"/debezium-mariadb/debezium-connector-mariadb; do
    [ -d "$src" ] || die "$src missing; run scripts/setup.sh jars"
    name=$(basename "$src")
    mkdir -p "$STACK_DIR/plugins/$name"
    ln -s "$src"/*.jar "$DEPS"/converter/*.jar "$DEPS"/connect/cdc-connect.jar "$STACK_DIR/plugins/$name/"
  done
}

start_connect() {
  local dir=$STACK_DIR/connect
  if alive connect; then
    log "connect already running (pid $(cat "$PIDS/connect.pid"))"
    # A worker started before a plugin was added does not load it: only a restart rereads plugin.path.
    connect_ready || log "connect does not list both Debezium connectors; to reload: scripts/stack.sh down connect && scripts/stack.sh up"
    return
  fi
  mkdir -p "$dir"
  plugin_dir
  cat > "$dir/worker.properties" <<EOF
bootstrap.servers=127.0.0.1:$KAFKA_PORT
group.id=cdc-connect
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
config.storage.topic=_connect-configs
offset.storage.topic=_connect-offsets
status.storage.topic=_connect-status
config.storage.replication.factor=1
offset.storage.replication.factor=1
status.storage.replication.factor=1
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:$CONNECT_PORT
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$CONNECT_PORT
plugin.path=$STACK_DIR/plugins
EOF
  write_log4j "$dir/log4j.properties"
  # The worker's time zone is UTC whatever the shell's TZ: PostgreSQL's connector sends tstzrange values as the
  # text its JDBC session prints, and the driver sets that session's zone from the JVM's.
  nohup java -Xms256m -Xmx"$HEAP" -Duser.timezone=UTC -Dlog4j.configuration="file:$dir/log4j.properties" \
    -cp "$DEPS/kafka/*" org.apache.kafka.connect.cli.ConnectDistributed "$dir/worker.properties" \
    >> "$LOGS/connect.log" 2>&1 &
  echo $! > "$PIDS/connect.pid"
  wait_for connect 180 connect_ready
}

connect_ready() {
  local plugins
  plugins=$(curl -sf "http://127.0.0.1:$CONNECT_PORT/connector-plugins") || return 1
  grep -q PostgresConnector <<<"$plugins" && grep -q MariaDbConnector <<<"$plugins"
}

stop_one() { # stop_one NAME
  local name=$1 f=$PIDS/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    if [ "$name" = postgres ]; then
      as_postgres "$PG_BIN/pg_ctl" -D "$(pg_dir)/data" -m fast -w stop >/dev/null || kill "$pid"
    else
      kill "$pid"
    fi
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then log "$name (pid $pid) ignored SIGTERM; killing"; kill -9 "$pid"; fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}

check_services() { # check_services NAME...: each one a service of this script
  local name
  for name in "$@"; do
    [[ " ${SERVICES[*]} " == *" $name "* ]] || die "unknown service $name (services: ${SERVICES[*]})"
  done
}

cmd_up() { # cmd_up [NAME...]: the named services, or all, in start order
  local start=$SECONDS names=("$@") name
  [ ${#names[@]} -gt 0 ] || names=("${SERVICES[@]}")
  check_services "${names[@]}"
  ensure_installed "${names[@]}"
  mkdir -p "$LOGS" "$PIDS" "$STACK_DIR/lake" "$STACK_DIR/checkpoints"
  for name in "${SERVICES[@]}"; do
    if [[ " ${names[*]} " == *" $name "* ]]; then "start_$name"; fi
  done
  log "up in $((SECONDS - start))s"
  cmd_status
}

cmd_down() { # cmd_down [NAME...]: the named services, or all, in reverse start order
  local name i
  check_services "$@"
  for name in spark s3 connect registry kafka mariadb postgres; do
    if [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; then
      if [ "$name" = spark ]; then
        for i in $(seq "$SPARK_WORKERS" -1 1); do stop_one "spark-worker-$i"; done
        stop_one spark-master
      else
        stop_one "$name"
      fi
    fi
  done
}

cmd_reset() {
  cmd_down
  rm -rf "$(pg_dir)" "$STACK_DIR/pg" "$(mariadb_dir)" "$STACK_DIR/mariadb" "$STACK_DIR/kafka" "$STACK_DIR/connect" "$STACK_DIR/plugins" \
    "$STACK_DIR/lake" "$STACK_DIR/checkpoints" "$STACK_DIR/tests" "$STACK_DIR/spark"
  log "state wiped under $STACK_DIR"
}

cmd_unstick() { # cmd_unstick CONNECTOR
  local name=${1:-} config slot db pid i connect=http://127.0.0.1:$CONNECT_PORT
  [ -n "$name" ] || die "usage: scripts/stack.sh unstick CONNECTOR"
  config=$(curl -fsS "$connect/connectors/$name/config") || die "Kafka Connect at $connect has no connector $name"
  field() { printf '%s' "$config" | python3 -c "import json, sys; print(json.load(sys.stdin).get('$1', '$2'))"; }
  slot=$(field slot.name debezium)
  db=$(field database.dbname postgres)
  pid=$(psql_admin -d "$db" -c "select active_pid from pg_replication_slots where slot_name = '$slot'")
  if [ -n "$pid" ]; then
    log "replication slot $slot is held by backend $pid: ending it"
    psql_admin -d "$db" -c "select pg_terminate_backend($pid)" >/dev/null
  else
    log "replication slot $slot is held by no backend"
  fi
  curl -fsS -X POST "$connect/connectors/$name/restart?includeTasks=true" >/dev/null
  log "connector $name's tasks restarted; waiting for the slot to be taken"
  for i in $(seq 1 60); do
    pid=$(psql_admin -d "$db" -c "select active_pid from pg_replication_slots where slot_name = '$slot'")
    if [ -n "$pid" ]; then log "replication slot $slot is held by backend $pid: the connector streams"; return 0; fi
    sleep 1
  done
  die "replication slot $slot is still free 60 s after the restart: see $connect/connectors/$name/status"
}

cmd_status() {
  local name state pid i
  printf '%-10s %-8s %-8s %s\n' service state pid endpoint
  for name in "${SERVICES[@]}"; do
    state=stopped
    if [ "$name" = spark ]; then
      # The master's pid, then each worker's; `partial` when some of them run (`up` starts the others).
      pid=-
      for i in spark-master $(seq -f 'spark-worker-%g' 1 "$SPARK_WORKERS"); do
        if alive "$i"; then state=partial; pid+=,$(cat "$PIDS/$i.pid"); else pid+=,-; fi
      done
      pid=${pid#-,}
      if spark_alive; then state=running; fi
    else
      pid=$( [ -f "$PIDS/$name.pid" ] && cat "$PIDS/$name.pid" || echo -)
      if alive "$name"; then state=running; fi
    fi
    case $name in
      postgres) ep="postgresql://$PG_USER@127.0.0.1:$PG_PORT/{source,registry,metastore}" ;;
      mariadb)  ep="mysql://127.0.0.1:$MARIADB_PORT/source (root/$MARIADB_ROOT_PASSWORD, $MARIADB_CDC_USER/$MARIADB_CDC_PASSWORD)" ;;
      kafka)    ep="127.0.0.1:$KAFKA_PORT (controller $CONTROLLER_PORT, proxied $KAFKA_PROXIED_LISTENER_PORT)" ;;
      registry) ep="http://127.0.0.1:$REGISTRY_PORT/apis/registry/v3" ;;
      connect)  ep="http://127.0.0.1:$CONNECT_PORT" ;;
      s3)       ep="http://127.0.0.1:$S3_PORT (s3a://$S3_BUCKET/, in memory)" ;;
      spark)    ep="spark://127.0.0.1:$SPARK_MASTER_PORT (UI and /json: http://127.0.0.1:$SPARK_UI_PORT; $SPARK_WORKERS workers, $SPARK_WORKER_CORES core $SPARK_WORKER_MEMORY each)" ;;
    esac
    printf '%-10s %-8s %-8s %s\n' "$name" "$state" "$pid" "$ep"
  done
  echo "logs: $LOGS   lake: s3a://$S3_BUCKET/ (conf/local.yaml) or $STACK_DIR/lake for local paths"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  reset) cmd_reset ;;
  status) cmd_status ;;
  unstick) shift; cmd_unstick "$@" ;;
  -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
