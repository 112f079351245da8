# shellcheck shell=bash
#
# peers.sh: Redis, NATS JetStream and RabbitMQ as local peers for side-by-side benchmarks.
#
# Source it (`. scripts/lib/peers.sh`), then:
#
#   peers_install                      # apt-get the missing servers (root or sudo)
#   base=$(mktemp -d); trap stop_peers EXIT
#   start_redis  "$base" 16379         # AOF with fsync on every write, like narad's 202
#   start_nats   "$base" 14222         # JetStream, file storage
#   start_rabbit "$base" 15672         # AMQP listener; dist port 25672, epmd 4369
#   read -r p50 p99 cpu < <(fsync_latency_us "$base")
#   machine_description "$base"
#
# Every server listens on loopback only: this workplace forbids traffic to anything else, and
# a benchmark peer has no business being reachable from outside. No systemd: the image's
# policy-rc.d keeps packaged services from starting, so each server runs as a child of the
# calling shell, with its data and log under BASE/<name>.
#
# The start_* functions record what they started in PEERS_* globals, which stop_peers reads,
# so call them directly, never inside $(...) or a pipeline (a subshell would lose the state
# and own the children). Safe under `set -euo pipefail`: nothing here relies on, or changes,
# the caller's shell options. Progress and errors go to stderr; stdout carries only the
# values that fsync_latency_us and machine_description print.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  echo "peers.sh is a library: source it, do not run it" >&2
  exit 2
fi

# State of what this library started. `:=` so that sourcing the file twice keeps it.
: "${PEERS_REDIS_PID:=}" "${PEERS_REDIS_PORT:=}"
: "${PEERS_NATS_PID:=}"
: "${PEERS_RABBIT_PID:=}" "${PEERS_RABBIT_HOME:=}" "${PEERS_RABBIT_BIN:=}" "${PEERS_EPMD_PID:=}"
# RabbitMQ needs two more ports besides its listener; fixed by default as in the notes, but
# overridable for a machine where something else holds them.
: "${PEERS_RABBIT_DIST_PORT:=25672}" "${PEERS_EPMD_PORT:=4369}"

_peers_log() { printf 'peers: %s\n' "$*" >&2; }

# Microseconds since the epoch; EPOCHREALTIME avoids forking `date` inside poll loops.
_peers_us() { local t=$EPOCHREALTIME; printf '%s' "${t/[.,]/}"; }

# A zombie still answers kill -0, so look at its state too.
_peers_alive() {
  local pid=${1:-} stat
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# Something else already on the port would answer our readiness probe and fool the caller,
# so every port is checked before a start.
_peers_port_free() {
  if command -v ss >/dev/null 2>&1; then
    [[ -z "$(ss -Htln "sport = :$1" 2>/dev/null)" ]]
  else
    # shellcheck disable=SC2016  # $1 belongs to the inner bash
    ! timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
  fi
}

_peers_port_open() { ! _peers_port_free "$1"; }

_peers_require_free() {
  local what=$1 port
  shift
  for port in "$@"; do
    # A non-numeric port would slip through ss's filter as "free".
    if ! [[ $port =~ ^[0-9]+$ ]] || (( port < 1 || port > 65535 )); then
      _peers_log "$what: invalid port '$port'"
      return 1
    fi
    if ! _peers_port_free "$port"; then
      _peers_log "$what: port $port is already in use"
      return 1
    fi
  done
}

# _peers_wait SECS PID WHAT LOG PROBE...: poll PROBE until it succeeds, PID dies or SECS pass.
# Probes bound their own duration (timeout/--max-time) so the deadline cannot be blown by a hung
# probe by more than one probe's limit.
_peers_wait() {
  local secs=$1 pid=$2 what=$3 log=$4 start now
  shift 4
  start=$(_peers_us)
  while :; do
    if "$@" >/dev/null 2>&1; then
      now=$(_peers_us)
      _peers_log "$what ready in $(( (now - start) / 1000000 )).$(printf '%02d' $(( (now - start) / 10000 % 100 ))) s"
      return 0
    fi
    if ! _peers_alive "$pid"; then
      _peers_log "$what exited during startup; last lines of $log:"
      tail -n 20 "$log" >&2 2>/dev/null || true
      return 1
    fi
    now=$(_peers_us)
    if (( now - start >= secs * 1000000 )); then
      _peers_log "$what not ready after ${secs} s; last lines of $log:"
      tail -n 20 "$log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.1
  done
}

# _peers_reap PID SECS: true once PID is gone (waiting at most SECS), reaping it if it is our
# child so that bash prints no job-status noise later.
_peers_reap() {
  local pid=$1 secs=$2 end
  end=$(( $(_peers_us) + secs * 1000000 ))
  while _peers_alive "$pid"; do
    (( $(_peers_us) < end )) || return 1
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
}

# _peers_kill PID NAME GRACE: TERM, then KILL if it outlives GRACE seconds. Never fails.
_peers_kill() {
  local pid=$1 name=$2 grace=$3
  _peers_alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  if ! _peers_reap "$pid" "$grace"; then
    _peers_log "$name (pid $pid) ignored SIGTERM for ${grace} s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    _peers_reap "$pid" 5 || _peers_log "$name (pid $pid) survived SIGKILL"
  fi
}

# ---------------------------------------------------------------------------------------------
# Installation

# peers_install: apt-get whatever server is missing. Touches apt only when something is missing,
# so a warm machine pays nothing and a fresh one (CI, new session) needs no manual step.
peers_install() {
  # binary -> Debian package; rabbitmq-server lives in /usr/sbin, which may be off a user's PATH.
  local -A want=([redis-server]=redis-server [redis-cli]=redis-tools
                 [nats-server]=nats-server [rabbitmq-server]=rabbitmq-server)
  local bin pkgs=() sudo=() log rc=0 start
  for bin in "${!want[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || pkgs+=("${want[$bin]}")
  done
  (( ${#pkgs[@]} )) || return 0

  if (( EUID != 0 )); then
    command -v sudo >/dev/null 2>&1 || { _peers_log "need root or sudo to install ${pkgs[*]}"; return 1; }
    sudo=(sudo)
  fi
  _peers_log "installing ${pkgs[*]}"
  start=$(_peers_us)
  # -qq still lets dpkg chatter, so keep the whole transcript aside and show it only on failure.
  log=$(mktemp "${TMPDIR:-/tmp}/peers-apt.XXXXXX")
  # The lock timeout rides out another apt run (e.g. a parallel session's) instead of failing.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 update \
    >"$log" 2>&1 || rc=$?
  (( rc )) || "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -y \
    -o DPkg::Lock::Timeout=300 --no-install-recommends install "${pkgs[@]}" >>"$log" 2>&1 || rc=$?
  if (( rc )); then
    _peers_log "apt-get failed (exit $rc):"
    tail -n 30 "$log" >&2
    rm -f "$log"
    return "$rc"
  fi
  rm -f "$log"
  _peers_log "installed in $(( ($(_peers_us) - start) / 1000000 )) s"
}

# ---------------------------------------------------------------------------------------------
# Redis

_peers_redis_ping() {
  [[ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == PONG ]]
}

# start_redis BASE PORT: AOF with `appendfsync always` and no RDB snapshots, so that Redis
# acknowledges a write only after fsync, as narad does; anything weaker would not compare.
start_redis() {
  local base=${1:?usage: start_redis BASE PORT} port=${2:?usage: start_redis BASE PORT}
  local dir=$base/redis
  if _peers_alive "$PEERS_REDIS_PID"; then _peers_log "redis already started (pid $PEERS_REDIS_PID)"; return 1; fi
  _peers_require_free redis "$port" || return 1
  mkdir -p "$dir" || return 1
  # Foreground in the background rather than --daemonize: $! is then the server itself, with no
  # pidfile race; the pidfile is written anyway for humans poking around. stdout goes to the
  # same log (both append) so that an argument error before logging starts is kept too.
  # shellcheck disable=SC2094
  redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
    --dir "$dir" --appendonly yes --appendfsync always --save '' \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --daemonize no \
    </dev/null >>"$dir/redis.log" 2>&1 &
  PEERS_REDIS_PID=$! PEERS_REDIS_PORT=$port
  _peers_wait 20 "$PEERS_REDIS_PID" "redis on 127.0.0.1:$port" "$dir/redis.log" \
    _peers_redis_ping "$port"
}

# ---------------------------------------------------------------------------------------------
# NATS

_peers_http_ok() {
  local port=$1 path=$2
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$port$path"
  else
    # shellcheck disable=SC2016  # $1, $2 belong to the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
      printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3 &&
      IFS= read -r line <&3 && [[ $line == *" 200 "* ]]' _ "$port" "$path"
  fi
}

# start_nats BASE PORT [MONITOR_PORT]: JetStream with file storage in BASE/nats/jetstream. The
# monitoring port (default PORT+4000) serves /healthz, which turns ok only once JetStream is up.
# Caveat for any comparison: JetStream acks before fsync (it syncs on a 2-minute timer), and
# Debian's 2.9.10 predates `sync_interval: always` (2.10+; 2.9 rejects the field), so NATS
# numbers here are for page-cache durability, not fsync-per-ack like narad, Redis and quorum queues.
start_nats() {
  local base=${1:?usage: start_nats BASE PORT [MONITOR_PORT]} port=${2:?usage: start_nats BASE PORT [MONITOR_PORT]}
  local mport=${3:-$(( port + 4000 ))} dir=$base/nats
  if _peers_alive "$PEERS_NATS_PID"; then _peers_log "nats already started (pid $PEERS_NATS_PID)"; return 1; fi
  _peers_require_free nats "$port" "$mport" || return 1
  mkdir -p "$dir" || return 1
  # The monitor binds to the -a address too (nats-server 2.9 has no --http_host flag).
  # No -l: stderr is the log, so a bad flag is in the same file as the server's own lines.
  nats-server -a 127.0.0.1 -p "$port" -m "$mport" \
    -js -sd "$dir" -P "$dir/nats.pid" \
    </dev/null >>"$dir/nats.log" 2>&1 &
  PEERS_NATS_PID=$!
  _peers_wait 20 "$PEERS_NATS_PID" "nats on 127.0.0.1:$port (monitor $mport)" "$dir/nats.log" \
    _peers_http_ok "$mport" /healthz
}

# ---------------------------------------------------------------------------------------------
# RabbitMQ

# _peers_rabbit [--timeout SECS] CMD ARGS...: run one of the package's inner scripts with the
# node's environment. The environment is passed per command rather than exported, so the
# caller's HOME and ERL_* stay untouched; every CLI call needs it too (cookie in HOME, node name).
_peers_rabbit() {
  local h=$PEERS_RABBIT_HOME limit=() cmd
  if [[ $1 == --timeout ]]; then limit=(timeout "$2"); shift 2; fi
  cmd=$1
  shift
  "${limit[@]}" env HOME="$h" \
    RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_MNESIA_BASE="$h/mnesia" RABBITMQ_LOG_BASE="$h/log" \
    RABBITMQ_CONFIG_FILE="$h/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$h/enabled_plugins" \
    RABBITMQ_CONF_ENV_FILE="$h/rabbitmq-env.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$h/advanced.config" \
    RABBITMQ_PID_FILE="$h/rabbit.pid" \
    ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT="$PEERS_EPMD_PORT" \
    RABBITMQ_DIST_PORT="$PEERS_RABBIT_DIST_PORT" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    "$PEERS_RABBIT_BIN/$cmd" "$@"
}

# The listener check is free, the diagnostics run costs an Erlang VM boot (seconds on a busy
# machine), so only pay for it once the port is open.
_peers_rabbit_ready() {
  _peers_port_open "$1" && _peers_rabbit --timeout 30 rabbitmq-diagnostics -q check_port_connectivity
}

# start_rabbit BASE PORT: RabbitMQ as in toolchain-notes §6, without systemd and on loopback
# only: AMQP on PORT, Erlang distribution on PEERS_RABBIT_DIST_PORT, epmd on PEERS_EPMD_PORT.
start_rabbit() {
  local base=${1:?usage: start_rabbit BASE PORT} port=${2:?usage: start_rabbit BASE PORT}
  local h=$base/rabbit srv
  if _peers_alive "$PEERS_RABBIT_PID"; then _peers_log "rabbit already started (pid $PEERS_RABBIT_PID)"; return 1; fi
  _peers_require_free rabbit "$port" "$PEERS_RABBIT_DIST_PORT" || return 1
  # The inner scripts, not /usr/sbin/rabbitmq-server: that wrapper switches to the rabbitmq
  # user and would drop our environment.
  srv=$(dpkg -L rabbitmq-server 2>/dev/null | grep 'rabbitmq/bin/rabbitmq-server$' | head -n 1 || true)
  [[ -n $srv && -x $srv ]] || { _peers_log "rabbitmq-server package not installed (peers_install)"; return 1; }
  PEERS_RABBIT_BIN=$(dirname "$srv") PEERS_RABBIT_HOME=$h
  mkdir -p "$h/mnesia" "$h/log" || return 1
  echo '[].' >"$h/enabled_plugins"
  printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users = none\n' "$port" >"$h/rabbitmq.conf"
  : >"$h/rabbitmq-env.conf"   # keeps /etc/rabbitmq/rabbitmq-env.conf out of the picture

  # Our own epmd, so that stop_peers kills exactly the one it started; Erlang would otherwise
  # spawn a daemonized one that outlives the node. An epmd already there (someone else's) is
  # used as it is and left alone.
  if _peers_port_free "$PEERS_EPMD_PORT"; then
    local epmd
    epmd=$(PATH="$PATH:/usr/lib/erlang/bin" command -v epmd || true)
    [[ -n $epmd ]] || { _peers_log "epmd not found (erlang-base missing?)"; return 1; }
    ERL_EPMD_ADDRESS=127.0.0.1 "$epmd" -address 127.0.0.1 -port "$PEERS_EPMD_PORT" \
      </dev/null >>"$h/log/epmd.log" 2>&1 &
    PEERS_EPMD_PID=$!
    _peers_wait 10 "$PEERS_EPMD_PID" "epmd on 127.0.0.1:$PEERS_EPMD_PORT" "$h/log/epmd.log" \
      _peers_port_open "$PEERS_EPMD_PORT" || return 1
  else
    _peers_log "epmd port $PEERS_EPMD_PORT already taken; assuming a running epmd and leaving it be"
  fi

  _peers_rabbit rabbitmq-server </dev/null >>"$h/log/server.out" 2>&1 &
  PEERS_RABBIT_PID=$!
  _peers_wait 90 "$PEERS_RABBIT_PID" "rabbit on 127.0.0.1:$port" "$h/log/server.out" \
    _peers_rabbit_ready "$port"
}

# ---------------------------------------------------------------------------------------------
# Teardown

# stop_peers: stop whatever this library started; fit for `trap stop_peers EXIT`. Tolerates
# servers that are already gone, never fails, and clears the state so a second call is a no-op.
stop_peers() {
  local beam
  if [[ -n $PEERS_REDIS_PID ]]; then
    if _peers_alive "$PEERS_REDIS_PID"; then
      timeout 10 redis-cli -h 127.0.0.1 -p "$PEERS_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
      _peers_reap "$PEERS_REDIS_PID" 10 || true
    fi
    _peers_kill "$PEERS_REDIS_PID" redis-server 5
    _peers_log "redis stopped"
    PEERS_REDIS_PID='' PEERS_REDIS_PORT=''
  fi

  if [[ -n $PEERS_NATS_PID ]]; then
    _peers_kill "$PEERS_NATS_PID" nats-server 10
    _peers_log "nats stopped"
    PEERS_NATS_PID=''
  fi

  if [[ -n $PEERS_RABBIT_PID ]]; then
    # $! is the package's sh wrapper, which runs the VM as a child and waits for it; the VM's
    # own pid is in the pidfile, for when the graceful stop fails.
    beam=$(cat "$PEERS_RABBIT_HOME/rabbit.pid" 2>/dev/null || true)
    if _peers_alive "$PEERS_RABBIT_PID" || _peers_alive "$beam"; then
      _peers_rabbit --timeout 60 rabbitmqctl -q stop >/dev/null 2>&1 || true
    fi
    [[ $beam =~ ^[0-9]+$ && $beam != "$PEERS_RABBIT_PID" ]] && _peers_kill "$beam" beam.smp 20
    _peers_kill "$PEERS_RABBIT_PID" rabbitmq-server 20
    _peers_log "rabbit stopped"
    PEERS_RABBIT_PID=''
  fi
  if [[ -n $PEERS_EPMD_PID ]]; then
    _peers_kill "$PEERS_EPMD_PID" epmd 5
    PEERS_EPMD_PID=''
  fi
  return 0
}

# ---------------------------------------------------------------------------------------------
# Machine facts for the report

# fsync_latency_us DIR [COUNT] [MODE]: "p50_us p99_us cpu_us" of writing 4 KiB and
# fdatasync-ing it, COUNT times (default 200), in a scratch file in DIR; cpu_us is the process's
# CPU (user + system) per write + sync. MODE `append` (default) grows the file, carrying the
# size/extent metadata the flush must write, as a log that appends does; `overwrite` writes into
# a file zero-filled beforehand, as Narad's preallocated write-ahead log files do. Every
# throughput number with fsync per write is bounded by this, so it belongs next to them.
fsync_latency_us() {
  local dir=${1:?usage: fsync_latency_us DIR [COUNT] [MODE]} count=${2:-200} mode=${3:-append}
  python3 - "$dir" "$count" "$mode" <<'PY'
import math, os, sys, tempfile, time

directory, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd, path = tempfile.mkstemp(prefix=".fsync-probe-", dir=directory)
try:
    block = os.urandom(4096)
    if mode == "overwrite":
        os.write(fd, bytes(4096 * (count + 20)))
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    for _ in range(10):  # warm-up: first allocations and journal commits are outliers
        os.write(fd, block)
        os.fdatasync(fd)
    samples = []
    cpu0 = time.process_time()
    for _ in range(count):
        t0 = time.perf_counter()
        os.write(fd, block)
        os.fdatasync(fd)
        samples.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / count
finally:
    os.close(fd)
    os.unlink(path)
samples.sort()
mid = count // 2
p50 = samples[mid] if count % 2 else (samples[mid - 1] + samples[mid]) / 2
p99 = samples[max(0, math.ceil(0.99 * count) - 1)]  # nearest rank
print(f"{p50 * 1e6:.0f} {p99 * 1e6:.0f} {cpu * 1e6:.0f}")
PY
}

_peers_pkg_version() {
  local v
  v=$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true)
  printf '%s' "${v:-not installed}"
}

# machine_description [DIR]: one Markdown paragraph on the machine the numbers came from;
# DIR (default: the current directory) is where the data lives, for its filesystem type.
machine_description() {
  local dir=${1:-.} cpu cores visible mem fs dev
  cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
  [[ -n $cpu ]] || cpu=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { print $2; exit }' || true)
  cores=$(nproc 2>/dev/null || echo '?')
  visible=$(grep -c '^processor' /proc/cpuinfo 2>/dev/null || true)
  mem=$(awk '/^MemTotal:/ { printf "%.1f", $2 / 1048576; exit }' /proc/meminfo 2>/dev/null || true)
  read -r dev fs < <(df -PT "$dir" 2>/dev/null | awk 'NR == 2 { print $1, $2 }' || true) || true
  printf '**Machine:** %s, %s cores usable (nproc' "${cpu:-unknown CPU}" "$cores"
  [[ -n $visible && $visible != "$cores" ]] && printf '; %s logical CPUs in /proc/cpuinfo' "$visible"
  # shellcheck disable=SC2016  # literal Markdown backticks
  printf '), %s GiB RAM, Linux %s; data directory on %s (`%s`). ' \
    "${mem:-?}" "$(uname -r)" "${fs:-unknown filesystem}" "${dev:-?}"
  printf 'Peers from Debian packages: redis-server %s, nats-server %s, rabbitmq-server %s (Erlang %s).\n' \
    "$(_peers_pkg_version redis-server)" "$(_peers_pkg_version nats-server)" \
    "$(_peers_pkg_version rabbitmq-server)" "$(_peers_pkg_version erlang-base)"
}
