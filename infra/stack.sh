#!/usr/bin/env bash
# The real local stack, every service on 127.0.0.1:
#   PostgreSQL 15 (the Prefect server's database) -> `prefect server start` (API and web UI)
#   -> a `process` work pool and a worker; moto_server as the S3 endpoint, with a
#   bucket and Prefect S3 blocks (AwsCredentials + S3Bucket, and the S3Bucket that holds
#   background task runs' parameters) registered.
#
# Usage: infra/stack.sh start|stop|status [postgres|s3|server|worker|worker@POOL ...]
#        (none = all but the stage workers), then, in a client shell:
#        source .infra/env.sh
#   worker@POOL is a stage worker of pool POOL (`python -m flows.stage_worker`: a Prefect
#   task worker that runs the stages `cluster.placement` puts on POOL and keeps their models
#   loaded), e.g. `infra/stack.sh start worker@train-pool`; `worker@POOL#2` is a second one
#   of that pool. Starting a component starts what it needs first (PostgreSQL, S3, server);
#   `stop` with no component stops the stage workers too.
#
# Settings (environment; `start` saves them in $INFRA_STATE_DIR/stack.conf, later calls
# reuse them unless set again):
#   INFRA_STATE_DIR (./.infra, or $NEMO_RL_INFRA_STATE_DIR from a sourced env.sh)
#   INFRA_PG_PORT (5433)   INFRA_API_PORT (4200)   INFRA_S3_PORT (9000)
#   INFRA_WORK_POOL (local-process)   INFRA_BUCKET (nemo-rl)
#   INFRA_START_TIMEOUT (120, seconds per service)   INFRA_PGBIN (/usr/lib/postgresql/15/bin)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A shell that sourced some stack's env.sh acts on that stack.
STATE=${INFRA_STATE_DIR:-${NEMO_RL_INFRA_STATE_DIR:-$ROOT/.infra}}
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
# shellcheck source=/dev/null
[[ -f $STATE/stack.conf ]] && source "$STATE/stack.conf"
: "${INFRA_PG_PORT:=5433}" "${INFRA_API_PORT:=4200}" "${INFRA_S3_PORT:=9000}"
: "${INFRA_WORK_POOL:=local-process}" "${INFRA_BUCKET:=nemo-rl}" "${INFRA_START_TIMEOUT:=120}"

BIN=$ROOT/.venv/bin
[[ -x $BIN/prefect ]] || BIN=$(dirname "$(command -v prefect)")
PGBIN=${INFRA_PGBIN:-/usr/lib/postgresql/15/bin}
PGDATA=$STATE/pgdata
LOGS=$STATE/logs
RUN=$STATE/run
mkdir -p "$LOGS" "$RUN"

die() { echo "stack: $*" >&2; exit 1; }

# Fail with the log tail, so the reason is on screen and not only in a file.
fail_with_log() {
  local what=$1 log=$2
  echo "stack: $what; last lines of $log:" >&2
  tail -n 40 "$log" >&2 2>/dev/null || true
  exit 1
}

# wait_for NAME LOG CHECK...: poll CHECK every 0.2 s until it succeeds or the timeout passes.
wait_for() {
  local name=$1 log=$2 deadline=$((SECONDS + INFRA_START_TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail_with_log "$name not healthy after ${INFRA_START_TIMEOUT}s" "$log"
    if [[ -f $RUN/$name.pid ]] && ! kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
      fail_with_log "$name exited during start" "$log"
    fi
    sleep 0.2
  done
  echo "  $name up at +$((SECONDS - START_T0)) s"
}

save_settings() {
  # `:=` lines, so a setting given in the environment later still wins over the saved one.
  cat >"$STATE/stack.conf" <<EOF
: "\${INFRA_PG_PORT:=$INFRA_PG_PORT}" "\${INFRA_API_PORT:=$INFRA_API_PORT}" "\${INFRA_S3_PORT:=$INFRA_S3_PORT}"
: "\${INFRA_WORK_POOL:=$INFRA_WORK_POOL}" "\${INFRA_BUCKET:=$INFRA_BUCKET}"
EOF
}

# The file clients source. The S3 secret is made once per state dir and kept private.
write_env() {
  local secret_file=$STATE/s3_secret
  if [[ ! -s $secret_file ]]; then
    (umask 077 && od -An -N20 -tx1 /dev/urandom | tr -d ' \n' >"$secret_file")
  fi
  local s3=http://127.0.0.1:$INFRA_S3_PORT
  (umask 077 && cat >"$STATE/env.sh" <<EOF
# Written by infra/stack.sh start: source it to talk to the local stack.
export NEMO_RL_PROJECT_ROOT=$ROOT
export NEMO_RL_INFRA_STATE_DIR=$STATE
export PREFECT_HOME=$STATE/prefect_home
export PREFECT_API_URL=http://127.0.0.1:$INFRA_API_PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK=1
export PREFECT_CLI_PROMPT=false
export NEMO_RL_WORK_POOL=$INFRA_WORK_POOL
# The venv's prefect and python first, for the commands the README runs next.
export PATH="$BIN:\${PATH}"
export AWS_ACCESS_KEY_ID=nemo-rl-local
export AWS_SECRET_ACCESS_KEY=$(cat "$secret_file")
export AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=$s3
export NEMO_RL_S3_ENDPOINT_URL=$s3
export NEMO_RL_S3_BUCKET=$INFRA_BUCKET
export NEMO_RL_STORAGE_ROOT=s3://$INFRA_BUCKET
export NEMO_RL_S3_CREDENTIALS_BLOCK=nemo-rl-s3-credentials
export NEMO_RL_S3_BUCKET_BLOCK=nemo-rl-s3
# Background task runs' parameters (placed stages), where every stage worker reads them.
export NEMO_RL_TASK_SCHEDULING_BLOCK=nemo-rl-task-scheduling
export PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK=s3-bucket/nemo-rl-task-scheduling
EOF
  )
}

# A pid file names a live process only if that process still leads the session we made
# for it with setsid (a recycled pid does not) and is no zombie (killed, not yet reaped).
alive() {
  local f=$RUN/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  ps -o sid=,stat= -p "$pid" 2>/dev/null | awk -v pid="$pid" '$1 == pid && $2 !~ /^Z/ {ok = 1} END {exit !ok}'
}

# session_members SID...: the live (not zombie) processes of those sessions.
session_members() {
  ps -eo pid=,sid=,stat= | awk -v sids=" $* " 'index(sids, " " $2 " ") && $3 !~ /^Z/ {print $1}'
}

# launch NAME CMD...: run CMD in a session of its own and record it, so stop finds it and
# everything it started (a worker's flow-run processes), also those of an earlier worker
# that was killed and restarted.
launch() {
  local name=$1
  shift
  [[ -f $LOGS/$name.log ]] && mv "$LOGS/$name.log" "$LOGS/$name.log.1"
  (cd "$ROOT" && exec setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null) &
  echo $! >"$RUN/$name.pid"
  echo $! >>"$RUN/$name.sessions"
}

# stop_sessions NAME...: INT every process of the NAMEs' sessions (what a Prefect worker and
# the server shut down cleanly on), then TERM, then KILL whatever is left. Only those pids.
# The NAMEs shut down side by side: stopping N stage workers takes one's shutdown, not N.
stop_sessions() {
  local names=("$@") name signal i pids sessions
  mapfile -t sessions < <(for name in "${names[@]}"; do
    cat "$RUN/$name.sessions" "$RUN/$name.pid" 2>/dev/null
  done | sort -u)
  ((${#sessions[@]})) || return 0
  for signal in INT TERM KILL; do
    pids=$(session_members "${sessions[@]}")
    [[ -n $pids ]] || break
    # shellcheck disable=SC2086 # one pid per word
    kill -"$signal" $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [[ -n $(session_members "${sessions[@]}") ]] || break 2
      sleep 0.2
    done
    echo "stack: ${names[*]} still running after SIG$signal: $(session_members "${sessions[@]}" | xargs)" >&2
  done
  for name in "${names[@]}"; do
    rm -f "$RUN/$name.pid" "$RUN/$name.sessions"
    echo "stopped $name"
  done
}

# initdb and the postmaster refuse to run as root: use the `postgres` OS user then.
as_pg() {
  if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_up() { [[ -f $PGDATA/postmaster.pid ]] && as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }

start_postgres() {
  pg_up && return 0
  [[ -x $PGBIN/initdb ]] || die "no PostgreSQL in $PGBIN; install it: apt-get install -y postgresql (or set INFRA_PGBIN)"
  if [[ ! -f $PGDATA/PG_VERSION ]]; then
    mkdir -p "$PGDATA"
    if ((EUID == 0)); then
      chown postgres:postgres "$PGDATA"
      runuser -u postgres -- test -w "$PGDATA" ||
        die "the postgres OS user cannot reach $PGDATA: make every parent of $STATE world-executable (chmod o+x) or pick another INFRA_STATE_DIR"
    fi
    as_pg "$PGBIN/initdb" -D "$PGDATA" -U prefect --auth=trust -E UTF8 --no-sync >"$LOGS/initdb.log" 2>&1 ||
      fail_with_log "initdb failed" "$LOGS/initdb.log"
  fi
  # TCP on 127.0.0.1 only, no unix socket (a long state path would overflow its name).
  as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/postgres.log" -w -t "$INFRA_START_TIMEOUT" \
    -o "-h 127.0.0.1 -p $INFRA_PG_PORT -c unix_socket_directories='' -c max_connections=200 -c synchronous_commit=off" \
    start >/dev/null || fail_with_log "PostgreSQL did not start" "$PGDATA/postgres.log"
  if ! as_pg "$PGBIN/psql" -h 127.0.0.1 -p "$INFRA_PG_PORT" -U prefect -d postgres -Atc \
    "select 1 from pg_database where datname='prefect'" | grep -q 1; then
    as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$INFRA_PG_PORT" -U prefect prefect
  fi
}

stop_postgres() {
  pg_up || return 0
  as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "stopped postgres"
}

s3_healthy() { curl -s -o /dev/null "http://127.0.0.1:$INFRA_S3_PORT/moto-api/"; }

start_s3() {
  alive s3 && return 0
  NEEDS_REGISTER=1
  launch s3 "$BIN/moto_server" -H 127.0.0.1 -p "$INFRA_S3_PORT"
}

server_healthy() { curl -sf "$PREFECT_API_URL/health"; }

start_server() {
  alive server && return 0
  pg_up || die "start postgres before the server"
  NEEDS_REGISTER=1
  PREFECT_SERVER_DATABASE_CONNECTION_URL=postgresql+asyncpg://prefect@127.0.0.1:$INFRA_PG_PORT/prefect \
    launch server "$BIN/prefect" server start --host 127.0.0.1 --port "$INFRA_API_PORT" --analytics-off
}

worker_started() { grep -q "Worker '.*' started" "$LOGS/${1:-worker}.log"; }

# start_worker: the stack's process worker (it runs the deployments' flow runs).
start_worker() {
  alive worker && return 0
  server_healthy >/dev/null || die "start the server before the worker"
  # Poll every 2 s instead of 10 s: a deployed run starts within seconds.
  PREFECT_WORKER_QUERY_SECONDS=2 launch worker "$BIN/prefect" worker start \
    --pool "$INFRA_WORK_POOL" --type process --name "local-worker-$INFRA_API_PORT"
  wait_for worker "$LOGS/worker.log" worker_started worker
}

# pool_of worker@POOL[#N]: POOL.
pool_of() { local pool=${1#worker@}; echo "${pool%%#*}"; }

# stage_worker_listening NAME: the server holds NAME's process connected for its pool's
# stage tasks (Prefect's task worker registry names a worker host-pid).
stage_worker_listening() {
  local name=$1 pool
  pool=$(pool_of "$name")
  alive "$name" || return 1
  curl -sf -X POST "$PREFECT_API_URL/task_workers/filter" -H 'Content-Type: application/json' \
    -d "{\"task_worker_filter\": {\"task_keys\": [\"stage@$pool\"]}}" |
    grep -q "\"$(hostname)-$(cat "$RUN/$name.pid")\""
}

# start_stage_worker worker@POOL[#N]: a stage worker of POOL, named POOL-worker-PORT[-N].
start_stage_worker() {
  local name=$1 pool suffix=
  pool=$(pool_of "$name")
  [[ $name == *#* ]] && suffix=-${name##*#}
  alive "$name" && return 0
  server_healthy >/dev/null || die "start the server before $name"
  launch "$name" "$BIN/python" -m flows.stage_worker --pool "$pool" \
    --name "$pool-worker-$INFRA_API_PORT$suffix"
  wait_for "$name" "$LOGS/$name.log" stage_worker_listening "$name"
}

# The stage workers this state dir has run (started or stopped since).
pool_workers() {
  local f
  for f in "$RUN"/worker@*.sessions; do
    if [[ -e $f ]]; then basename "$f" .sessions; fi
  done
}

# wants NAME: is NAME among the components this call acts on?
wants() { [[ " ${COMPONENTS[*]} " == *" $1 "* ]]; }

START_T0=$SECONDS
NEEDS_REGISTER=0

start() {
  save_settings
  write_env
  # shellcheck source=/dev/null
  source "$STATE/env.sh"
  # Services boot side by side; only the server needs PostgreSQL first, only the worker
  # needs a healthy server. The bucket and blocks (idempotent) go in as soon as both answer.
  if wants s3; then start_s3; fi
  if wants postgres; then start_postgres; fi
  if wants server; then start_server; fi
  local register_pid=
  # Only after a (re)start of S3 or the server: the bucket lives in moto's memory.
  if ((NEEDS_REGISTER)); then
    INFRA_START_TIMEOUT=$INFRA_START_TIMEOUT launch register "$BIN/python" "$ROOT/infra/register.py"
    register_pid=$!
  fi
  if wants s3; then wait_for s3 "$LOGS/s3.log" s3_healthy; fi
  if wants server; then wait_for server "$LOGS/server.log" server_healthy; fi
  if wants worker; then start_worker; fi
  local component
  for component in "${COMPONENTS[@]}"; do
    if [[ $component == worker@* ]]; then start_stage_worker "$component"; fi
  done
  [[ -z $register_pid ]] || wait "$register_pid" || fail_with_log "registering the S3 bucket and blocks failed" "$LOGS/register.log"
  echo "stack up in $((SECONDS - START_T0)) s; clients: source $STATE/env.sh"
}

stop() {
  local name names=()
  for name in "${COMPONENTS[@]}"; do
    if [[ $name == worker@* ]]; then names+=("$name"); fi
  done
  if ((ALL)); then mapfile -t -O "${#names[@]}" names < <(pool_workers); fi
  # Order matters: a worker whose API is gone hangs on shutdown, so workers go first.
  ((${#names[@]} == 0)) || stop_sessions "${names[@]}"
  for name in worker register server s3 postgres; do
    wants "$name" || [[ $name == register ]] || continue
    if [[ $name == postgres ]]; then stop_postgres; else stop_sessions "$name"; fi
  done
}

status() {
  # shellcheck source=/dev/null
  [[ -f $STATE/env.sh ]] && source "$STATE/env.sh"
  local ok=0
  report() { if "$2" >/dev/null 2>&1; then echo "$1: up ($3)"; else echo "$1: down"; ok=1; fi; }
  report postgres pg_up "127.0.0.1:$INFRA_PG_PORT"
  report s3 s3_healthy "http://127.0.0.1:$INFRA_S3_PORT bucket $INFRA_BUCKET"
  report server server_healthy "${PREFECT_API_URL:-}"
  report worker worker_up "pool $INFRA_WORK_POOL"
  local name
  for name in $(pool_workers); do  # a stage worker, while this stack runs one
    if stage_worker_listening "$name"; then echo "$name: up (pool $(pool_of "$name"))"; else echo "$name: down"; fi
  done
  return $ok
}

worker_up() { alive worker && worker_started worker; }

cmd=${1:-}
shift || true
COMPONENTS=("$@")
ALL=$((${#COMPONENTS[@]} == 0))
((ALL)) && COMPONENTS=(postgres s3 server worker)
for name in "${COMPONENTS[@]}"; do
  [[ $name =~ ^(postgres|s3|server|worker|worker@[A-Za-z0-9._-]+(#[0-9]+)?)$ ]] ||
    die "unknown component '$name' (postgres|s3|server|worker|worker@POOL[#N])"
done
# Starting a component starts what it needs first: the server needs PostgreSQL; workers
# need the server, and the runs they serve need S3 (and its blocks, registered with it).
if [[ $cmd == start ]]; then
  needs=()
  for name in "${COMPONENTS[@]}"; do
    case $name in
      server) needs+=(postgres) ;;
      worker | worker@*) needs+=(postgres s3 server) ;;
    esac
  done
  for name in "${needs[@]}"; do
    [[ " ${COMPONENTS[*]} " == *" $name "* ]] || COMPONENTS=("$name" "${COMPONENTS[@]}")
  done
fi
case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: infra/stack.sh start|stop|status [postgres|s3|server|worker ...]" ;;
esac
