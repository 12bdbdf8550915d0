#!/usr/bin/env bash
# Build and run the job's container image (Dockerfile) on this machine: no Docker engine, no image registry.
# usage: scripts/image.sh [build] [--tag NAME]
#        scripts/image.sh run [--tag NAME] [-e NAME[=VALUE]]... [--] [JOB ARGS...]
#   build (default)  installs podman and debootstrap when missing (apt-get); makes the base image
#                    localhost/debian:bookworm-min once (debootstrap --variant=minbase from the Debian mirror,
#                    $DEBIAN_MIRROR, default http://deb.debian.org/debian); builds the image on it (default tag
#                    localhost/cdc-lakehouse) with podman's layer cache, so unchanged inputs rebuild in seconds;
#                    prints the build times and the image size.
#   run              runs the image's ENTRYPOINT with JOB ARGS (default: its CMD), e.g.
#                    `--conf s3://lake/job.yaml --available-now`, as the image's USER with its ENV and WORKDIR,
#                    through chroot --userspec into the mounted image (podman run cannot set rlimits in this
#                    sandbox). The host's network is shared, so the local stack is reachable on loopback. /proc,
#                    /dev, /etc/hosts and /etc/resolv.conf come from the host; /tmp and the working directory are
#                    fresh, empty and removed afterwards, as a container's would be. -e NAME=VALUE sets a variable,
#                    -e NAME passes the caller's. Exits with the job's exit code.
# Needs root: apt-get, debootstrap, podman's storage, mount and chroot.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=localhost/debian:bookworm-min
TAG=localhost/cdc-lakehouse
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '[image] %s\n' "$*" >&2; }
usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

need_root() {
  [ "$(id -u)" = 0 ] || { echo "[image] needs root (podman storage, mount, chroot)" >&2; exit 1; }
}

install_tools() {
  command -v podman >/dev/null && command -v debootstrap >/dev/null && return 0
  log "apt-get install podman debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman debootstrap >/dev/null
}

# Whatever debootstrap left mounted under the root filesystem (its /proc, /sys) goes before the folder does.
remove_rootfs() {
  local dir=$1 m
  [ -d "$dir" ] || return 0
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' \
    /proc/self/mounts | sort -r)
  rm -rf --one-file-system "$dir"
}

build_base() {
  if podman image exists "$BASE"; then
    log "base $BASE exists"
    return 0
  fi
  local start=$SECONDS dir
  # Outside the repository: a root filesystem must never land in the work tree.
  dir=$(mktemp -d /var/tmp/cdc-debootstrap.XXXXXX)
  # shellcheck disable=SC2064  # the folder is fixed now
  trap "remove_rootfs '$dir'" EXIT
  log "debootstrap --variant=minbase bookworm ($MIRROR) into $dir"
  debootstrap --variant=minbase bookworm "$dir" "$MIRROR" >"$dir.log" 2>&1 || {
    tail -20 "$dir.log" >&2; rm -f "$dir.log"; exit 1
  }
  rm -f "$dir.log"
  # As debian:bookworm-slim has them: updates and security fixes for what the Dockerfile installs.
  cat >>"$dir/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | podman import - "$BASE" >/dev/null
  remove_rootfs "$dir"
  trap - EXIT
  log "base $BASE built in $((SECONDS - start))s"
}

build() {
  need_root
  install_tools
  build_base
  local start=$SECONDS old new
  old=$(podman image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
  # The steps that download over https (Maven Central, PyPI) trust what this host trusts: its CA bundle and Java
  # trust store as build secrets, mounted for those steps only and kept out of every layer. Needed behind a
  # TLS-inspecting proxy, whose CA the base image's ca-certificates do not have.
  local secrets=()
  [ ! -f /etc/ssl/certs/ca-certificates.crt ] || secrets+=(--secret "id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt")
  [ ! -f /etc/ssl/certs/java/cacerts ] || secrets+=(--secret "id=java-cacerts,src=/etc/ssl/certs/java/cacerts")
  log "podman build $TAG (base $BASE)"
  podman build --isolation=chroot --layers --build-arg BASE_IMAGE="$BASE" "${secrets[@]}" -t "$TAG" \
    -f "$ROOT/Dockerfile" "$ROOT"
  new=$(podman image inspect --format '{{.Id}}' "$TAG")
  # The image this build replaced, with the layers only it used (its app/ layer): without this every change to
  # app/ would leave an untagged image behind. The build cache of unchanged steps is shared and stays.
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  log "image $TAG built in $((SECONDS - start))s"
  podman image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' "$TAG"
}

# What the image says about how to run it; one value per line.
inspect() { podman image inspect --format "$1" "$TAG"; }

# Undo what run mounted, innermost first, then the image itself; the scratch folder last (never across a mount).
unmount_run() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}"; done
  podman image unmount "$TAG" >/dev/null || true
  rm -rf --one-file-system "$scratch"
}

run() {
  need_root
  local envs=() args=() saw_args=0
  while (($#)); do
    case $1 in
      --tag) TAG=${2:?--tag needs a name}; shift 2 ;;
      -e|--env)
        [ $# -ge 2 ] || { echo "[image] $1 needs NAME or NAME=VALUE" >&2; exit 2; }
        if [[ $2 == *=* ]]; then envs+=("$2"); elif [ -n "${!2+x}" ]; then envs+=("$2=${!2}"); fi
        shift 2 ;;
      --) shift; args=("$@"); saw_args=1; break ;;
      *) args=("$@"); saw_args=1; break ;;
    esac
  done
  podman image exists "$TAG" || { echo "[image] no image $TAG: run scripts/image.sh build" >&2; exit 1; }

  local entrypoint=() cmd=() image_env=() user workdir uid gid home
  mapfile -t entrypoint < <(inspect '{{range .Config.Entrypoint}}{{println .}}{{end}}' | sed '/^$/d')
  mapfile -t cmd < <(inspect '{{range .Config.Cmd}}{{println .}}{{end}}' | sed '/^$/d')
  mapfile -t image_env < <(inspect '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
  user=$(inspect '{{.Config.User}}')
  workdir=$(inspect '{{.Config.WorkingDir}}')
  [ "$saw_args" = 1 ] || args=("${cmd[@]}")

  # Globals, not locals: the EXIT trap that unmounts may run after this function has returned.
  mounted=()
  mnt=$(podman image mount "$TAG")
  scratch=$(mktemp -d /var/tmp/cdc-image-run.XXXXXX)
  trap unmount_run EXIT
  # A signal (a test's timeout) still unmounts: the EXIT trap runs on exit, not on a fatal signal.
  trap 'exit 143' TERM
  trap 'exit 130' INT

  # USER as the image gives it, names looked up in the image's own /etc/passwd and /etc/group.
  uid=${user%%:*}
  gid=${user#*:}
  [ "$gid" != "$user" ] || gid=""
  [ -n "$uid" ] || uid=0
  if ! [[ $uid =~ ^[0-9]+$ ]]; then uid=$(awk -F: -v n="$uid" '$1 == n {print $3}' "$mnt/etc/passwd"); fi
  [ -n "$uid" ] || { echo "[image] user $user not in the image's /etc/passwd" >&2; exit 1; }
  if [ -z "$gid" ]; then gid=$(awk -F: -v u="$uid" '$3 == u {print $4}' "$mnt/etc/passwd"); fi
  if [ -n "$gid" ] && ! [[ $gid =~ ^[0-9]+$ ]]; then gid=$(awk -F: -v n="$gid" '$1 == n {print $3}' "$mnt/etc/group"); fi
  gid=${gid:-0}
  home=$(awk -F: -v u="$uid" '$3 == u {print $6}' "$mnt/etc/passwd")

  mount -t proc proc "$mnt/proc"; mounted+=("$mnt/proc")
  mount --bind /dev "$mnt/dev"; mounted+=("$mnt/dev")
  local f
  for f in /etc/hosts /etc/resolv.conf; do
    if [ -f "$mnt$f" ] && [ -f "$f" ]; then mount --bind -o ro "$f" "$mnt$f"; mounted+=("$mnt$f"); fi
  done
  mkdir -m 1777 "$scratch/tmp"
  chmod 1777 "$scratch/tmp"
  mount --bind "$scratch/tmp" "$mnt/tmp"; mounted+=("$mnt/tmp")
  workdir=${workdir:-/}
  if [ "$workdir" != / ]; then
    mkdir "$scratch/work"
    chown "$uid:$gid" "$scratch/work"
    mount --bind "$scratch/work" "$mnt$workdir"; mounted+=("$mnt$workdir")
  fi

  # The environment a container would get: the image's ENV, HOME from its passwd, then the -e variables.
  local environment=("HOME=${home:-/}" "${image_env[@]}" "${envs[@]}")
  log "run $TAG as $uid:$gid in $workdir: ${entrypoint[*]} ${args[*]}"
  rc=0
  chroot --userspec="$uid:$gid" "$mnt" /usr/bin/env -i --chdir="$workdir" "${environment[@]}" \
    "${entrypoint[@]}" "${args[@]}" || rc=$?
  exit "$rc"
}

command=build
if [ $# -gt 0 ] && [[ $1 != --tag ]]; then command=$1; shift; fi
case $command in
  -h|--help) usage ;;
  build)
    while (($#)); do
      case $1 in
        --tag) TAG=${2:?--tag needs a name}; shift 2 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
      esac
    done
    build ;;
  run) run "$@" ;;
  *) echo "unknown command: $command (see --help)" >&2; exit 2 ;;
esac
