#!/usr/bin/env bash
# Install everything the project needs on a fresh machine; idempotent, cheap when nothing changed.
# usage: scripts/setup.sh [system] [jars] [python] [s3] [cds]     (no argument: all five)
#   system  Debian packages: PostgreSQL 15 with PostGIS 3, MariaDB 10.11 server and client, a JDK 17, Maven, curl,
#           python3-venv (Debian's own PostgreSQL and MariaDB services are stopped: the stack runs its own)
#   jars    every JVM artifact in deps/jvm-artifacts.txt, from Maven Central into .deps/, and the project's
#           own JVM functions (the jvm step)
#   python  the virtualenv .venv with setup.cfg's pinned packages and its test extra
#   s3      the stack's S3 API server, gofakes3 from the Go module proxy, built by the machine's Go into .deps/bin
# One part of jars on its own:
#   jvm     the project's own JVM functions: jvm/, built by Maven into .deps/spark/cdc-functions.jar when jvm/
#           changed (scripts/package.sh runs it: the EMR package ships that jar)
#   cds     a class-data sharing archive of the Spark drivers' classes, .deps/cds/spark.jsa (devkit/cds.py), made
#           again when a jar or the JVM changed: conf/local.yaml's spark.class_archive (a cold driver starts faster)
# Runtime-only steps, for the container image (Dockerfile); never part of the default:
#   build-system    Debian packages the jars step needs: a JDK 17, Maven, python3 (the image's builder stage)
#   runtime-system  Debian packages the job needs to run: a JRE 17, python3 with venv (the image's final stage)
#   python-runtime  the virtualenv .venv with setup.cfg's install_requires only: no test extra, and not the project
#                   itself (spark-submit runs app/main.py from the tree, so the app code stays out of this step)
# JAR_SETS="spark ..." makes the jars step resolve only those sets of deps/jvm-artifacts.txt (default: every set).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
case ${1:-} in -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
log() { printf '[setup] %s\n' "$*"; }

stop_debian_mariadb() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now mariadb >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/mariadb ]; then
    /etc/init.d/mariadb stop >/dev/null 2>&1 || true
    if command -v update-rc.d >/dev/null; then update-rc.d mariadb disable >/dev/null 2>&1 || true; fi
  fi
}

system() {
  local missing=()
  [ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15 postgresql-client-15)
  # PostGIS: geometry/geography columns in the types tests (hstore ships with postgresql-15).
  [ -f /usr/lib/postgresql/15/lib/postgis-3.so ] || missing+=(postgresql-15-postgis-3)
  # MariaDB: the second source database of the stack (Debezium's MariaDB connector reads its binlog).
  { [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null; } || missing+=(mariadb-server)
  command -v mariadb >/dev/null || missing+=(mariadb-client)
  command -v java >/dev/null || missing+=(openjdk-17-jdk-headless)
  command -v mvn >/dev/null || missing+=(maven)
  command -v curl >/dev/null || missing+=(curl)
  # The S3 server's source patch (s3_server).
  command -v patch >/dev/null || missing+=(patch)
  # Debian's python3 makes no virtualenv without python3-venv (its ensurepip).
  python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "[setup] need root to apt-get install ${missing[*]}" >&2; exit 1; }
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian's package starts its own cluster on 5432; the stack runs its own on loopback instead.
    if command -v pg_ctlcluster >/dev/null; then pg_ctlcluster 15 main stop 2>/dev/null || true; fi
    # Likewise Debian's MariaDB on 3306 (/var/lib/mysql): stopped and kept from starting at boot.
    if [[ " ${missing[*]} " == *" mariadb-server "* ]]; then stop_debian_mariadb; fi
  fi
}

# apt-get install only what is missing; an image layer keeps no package lists or downloaded .debs.
apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  [ "$(id -u)" = 0 ] || { echo "[setup] need root to apt-get install ${missing[*]}" >&2; exit 1; }
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  apt-get clean
  rm -rf /var/lib/apt/lists/*
}

build_system() {
  # ca-certificates: Maven reaches Maven Central over https.
  apt_install ca-certificates openjdk-17-jdk-headless maven python3
}

runtime_system() {
  # python3-venv: Debian's python3 has no ensurepip without it.
  apt_install ca-certificates openjdk-17-jre-headless python3 python3-venv
}

jars() {
  local sets=()
  # JAR_SETS: a space-separated list of set names; empty resolves every set.
  read -r -a sets <<<"${JAR_SETS:-}"
  python3 scripts/fetch_jars.py "${sets[@]}"
  jvm_functions
}

# The job's JVM functions (app/cdc/debezium_types.py calls them through Spark's `reflect`), rebuilt when jvm/ changes;
# and the connector side's SMT (io.cdclake.connect, .deps/connect/cdc-connect.jar, linked into each Connect plugin).
# The crash tests' pause points (io.cdclake.testing) go to a jar of their own, never in .deps/spark (which the image
# and the package take): the tests' job processes get it last on their class path (tests/support/jobprocess.py), and
# .deps/spark-testing holds links to every jar of .deps/spark and that one, for sessions the tests pause in their own
# process (`spark.jars_dir: .deps/spark-testing`).
jvm_functions() {
  local stamp=.deps/spark/.cdc-functions.stamp want
  want=$(find jvm/pom.xml jvm/src -type f | sort | xargs cat | sha256sum | cut -d' ' -f1)
  if [ ! -f .deps/spark/cdc-functions.jar ] || [ ! -f .deps/testing/cdc-testing.jar ] || [ ! -f .deps/connect/cdc-connect.jar ] \
      || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "mvn package jvm/ (cdc-functions.jar, cdc-testing.jar, cdc-connect.jar)"
    mvn -q -B -f jvm/pom.xml -DskipTests package
    mkdir -p .deps/spark .deps/testing .deps/connect
    cp jvm/target/cdc-functions.jar .deps/spark/cdc-functions.jar
    cp jvm/target/cdc-functions-testing.jar .deps/testing/cdc-testing.jar
    cp jvm/target/cdc-functions-connect.jar .deps/connect/cdc-connect.jar
    echo "$want" > "$stamp"
  fi
  rm -rf .deps/spark-testing
  mkdir -p .deps/spark-testing
  ln -s "$PWD"/.deps/spark/*.jar "$PWD/.deps/testing/cdc-testing.jar" .deps/spark-testing/
}

python_env() {
  local stamp=.venv/.installed want
  want=$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "pip install -e .[test] into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[test]'
    echo "$want" > "$stamp"
  else
    log "python: .venv up to date"
  fi
}

# The stack's S3 API server (scripts/stack.sh start_s3): gofakes3's command, built by the machine's Go (1.24 or
# newer) from the Go module proxy's source with deps/gofakes3-list-prefix.patch applied: its in-memory backend then
# lists a prefix from the first key under it, where 1.2.0 reads every object of the bucket at every listing (25 ms
# a listing at 40,000 objects, 0.7 ms patched; docs/development.md). Go's module and build caches make a rebuild in
# a fresh clone take seconds.
GOFAKES3_MODULE=github.com/johannesboyne/gofakes3@v1.2.0
GOFAKES3_PATCH=deps/gofakes3-list-prefix.patch
s3_server() {
  local stamp=.deps/bin/.gofakes3.stamp go want src
  want="$GOFAKES3_MODULE $(sha256sum "$GOFAKES3_PATCH" | cut -d' ' -f1)"
  if [ -x .deps/bin/gofakes3 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    log "s3: gofakes3 up to date"
    return
  fi
  go=$(command -v go || echo /usr/local/go/bin/go)
  [ -x "$go" ] || { echo "[setup] need Go 1.24 or newer (go) to build the stack's S3 server $GOFAKES3_MODULE" >&2; exit 1; }
  log "build $GOFAKES3_MODULE with $GOFAKES3_PATCH into .deps/bin"
  src=$("$go" mod download -json "$GOFAKES3_MODULE" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf .deps/src/gofakes3 && mkdir -p .deps/src .deps/bin
  cp -r "$src" .deps/src/gofakes3 && chmod -R u+w .deps/src/gofakes3
  patch -s -p1 -d .deps/src/gofakes3 < "$GOFAKES3_PATCH"
  (cd .deps/src/gofakes3 && GOFLAGS=-mod=mod "$go" build -o "$ROOT/.deps/bin/gofakes3" ./cmd/gofakes3)
  echo "$want" > "$stamp"
}

python_runtime() {
  local stamp=.venv/.installed want reqs=()
  # The pins of setup.cfg's install_requires, read with the standard library (no project install needed).
  mapfile -t reqs < <(python3 -c '
import configparser
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
for line in cfg["options"]["install_requires"].splitlines():
    if line.strip() and not line.strip().startswith("#"):
        print(line.strip())
')
  [ ${#reqs[@]} -gt 0 ] || { echo "[setup] no install_requires in setup.cfg" >&2; exit 1; }
  # A stamp of its own kind: switching between python and python-runtime reinstalls.
  want="runtime $(printf '%s\n' "${reqs[@]}" | sha256sum | cut -d' ' -f1)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "pip install setup.cfg's install_requires into .venv (runtime only)"
    .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check "${reqs[@]}"
    echo "$want" > "$stamp"
  else
    log "python-runtime: .venv up to date"
  fi
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(system jars python s3 cds)
for s in "${steps[@]}"; do
  case $s in
    system) system ;;
    jars) jars ;;
    jvm) jvm_functions ;;
    python) python_env ;;
    s3) s3_server ;;
    build-system) build_system ;;
    runtime-system) runtime_system ;;
    python-runtime) python_runtime ;;
    cds) .venv/bin/python -m devkit.cds ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
