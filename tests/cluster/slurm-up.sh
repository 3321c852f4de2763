#!/usr/bin/env bash
# Bring up a throwaway single-node SLURM cluster in DIR, for tests/test_slurm.py:
#   munged, MariaDB, slurmdbd (so that sacct works: the snakemake SLURM executor checks job status
#   with sacct), slurmctld and slurmd, with one fake GPU (gres.conf AutoDetect=off, File=/dev/null).
#
#   tests/cluster/slurm-up.sh DIR        # then: SLURM_CONF=DIR/etc/slurm.conf sinfo
#   tests/cluster/slurm-down.sh DIR      # stops exactly the daemons this script started
#
# Everything lives in DIR: configuration, sockets, state, logs and the database. Ports are free ones
# picked at start-up, so it neither needs nor touches a system SLURM, munge or MariaDB. Missing Debian
# packages are installed with apt-get (root only). DIR/env holds SLURM_CONF, the partition name and
# SLURM_TEST_BIN, a folder of client commands (sbatch, srun, sacct, ...) bound to this cluster.
#
# Exit status: 0 up and the node idle; 77 cannot run here (not root, no apt-get): the caller skips;
# anything else: bring-up failed (DIR/log/ says why). PYTHON (default python3) picks the free ports.
set -euo pipefail

DIR=${1:?usage: slurm-up.sh DIR}
PARTITION=${SLURM_TEST_PARTITION:-epochlens-test}
CLUSTER=epochlens
PACKAGES=(munge mariadb-server slurmdbd slurmctld slurmd slurm-client)
COMMANDS=(munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacct sacctmgr sinfo)

skip() {
    echo "SKIP: $*" >&2
    exit 77
}
fail() {
    echo "slurm-up: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || skip "needs root (to install Debian's SLURM packages and run slurmd)"

export PATH="$PATH:/usr/sbin:/sbin"
missing() {
    local c
    for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null || return 0; done
    return 1
}
if missing; then
    command -v apt-get >/dev/null || skip "SLURM is not installed and there is no apt-get to install it"
    echo "slurm-up: installing ${PACKAGES[*]}" >&2
    # Install without starting the packages' own system services (we start our own instances).
    policy=/usr/sbin/policy-rc.d
    own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt_install() { apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"; }
    ok=1
    apt_install >"${TMPDIR:-/tmp}/epochlens-slurm-apt.log" 2>&1 ||
        { apt-get update -q && apt_install; } >>"${TMPDIR:-/tmp}/epochlens-slurm-apt.log" 2>&1 || ok=
    [ -n "$own_policy" ] && rm -f "$policy"
    [ -n "$ok" ] || fail "apt-get install ${PACKAGES[*]} failed: see ${TMPDIR:-/tmp}/epochlens-slurm-apt.log"
    missing && fail "still missing after installing ${PACKAGES[*]}"
fi

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
chmod 755 "$DIR"
mkdir -p "$DIR"/{etc,run,log,state,spool,db}
install -d -m 700 "$DIR/munge"
: >"$DIR/run/daemons"
# A failed bring-up stops what it had started (logs stay in DIR/log).
trap 'rc=$?; [ $rc = 0 ] || "$(dirname "$0")/slurm-down.sh" "$DIR"; exit $rc' EXIT

# Four free TCP ports on the loopback interface: slurmctld, slurmd, slurmdbd, MariaDB.
read -r CTLD_PORT SLURMD_PORT DBD_PORT DB_PORT < <("${PYTHON:-python3}" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)

NODE=$(hostname -s)
NCPU=$(nproc)
# The node claims at least 8 CPUs, so that a GPU job's --cpus-per-gpu=4 (profiles/slurm) fits beside a CPU
# job on a small machine; slurmd accepts the claim (SlurmdParameters=config_overrides) and nothing
# binds tasks to cores (TaskPlugin=task/none).
[ "$NCPU" -ge 8 ] || NCPU=8
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
# The node claims at least 64 GB so that the shipped profile's GPU-job memory fits on a small machine;
# memory is not a consumable here (CR_Core) and nothing enforces it.
[ "$MEM_MB" -ge 65536 ] || MEM_MB=65536

# Start "$@" detached, logging to DIR/log/NAME.log, and record "NAME PID STARTTIME" so that
# slurm-down.sh signals this very process and nothing else (a reused PID has another start time).
start() {
    local name=$1
    shift
    setsid "$@" >"$DIR/log/$name.out" 2>&1 </dev/null &
    local pid=$!
    local starttime
    starttime=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    echo "$name $pid $starttime" >>"$DIR/run/daemons"
}
alive() { kill -0 "$(awk -v n="$1" '$1 == n {print $2}' "$DIR/run/daemons")" 2>/dev/null; }
# wait_for NAME SECONDS COMMAND...: until COMMAND succeeds, failing early if daemon NAME died.
wait_for() {
    local name=$1 secs=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        alive "$name" || fail "$name exited during start-up; see $DIR/log/$name.*"
        [ $SECONDS -lt $end ] || fail "$name not ready after ${secs}s; see $DIR/log/$name.*"
        sleep 0.2
    done
}

# munge: authentication between the SLURM daemons and commands, on a socket of our own.
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
MUNGE_SOCKET=$DIR/munge/munge.socket
start munged munged --foreground --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"
wait_for munged 20 test -S "$MUNGE_SOCKET"

# MariaDB for slurmdbd, on 127.0.0.1:DB_PORT.
mariadb-install-db --no-defaults --datadir="$DIR/db" --user=root --skip-test-db \
    --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1 ||
    fail "mariadb-install-db failed; see $DIR/log/mariadb-install.log"
DB_SOCKET=$DIR/run/mysqld.sock
start mariadb mariadbd --no-defaults --datadir="$DIR/db" --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --user=root --pid-file="$DIR/run/mariadb.pid" \
    --log-error="$DIR/log/mariadb.log" --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900
wait_for mariadb 60 mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root ping
DB_PASS=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
mariadb --no-defaults --socket="$DB_SOCKET" -u root -e \
    "CREATE USER 'slurm'@'%' IDENTIFIED BY '$DB_PASS'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';"

cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
chmod 600 "$DIR/etc/slurmdbd.conf"

cat >"$DIR/etc/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# For the slurmdbd connection, the munge socket is given here (slurm.conf(5): AccountingStoragePass).
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=$MEM_MB Gres=gpu:1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

# One fake GPU: no detection, and a device file that exists everywhere.
cat >"$DIR/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu File=/dev/null
EOF

export SLURM_CONF=$DIR/etc/slurm.conf
# The client commands, bound to this cluster's configuration. SLURM_CONF alone is not enough: the
# executor plugin's job step drops SLURM_* variables before calling srun inside a job, which on a
# real cluster then reads /etc/slurm/slurm.conf. Putting DIR/bin first on PATH gives the same.
mkdir -p "$DIR/bin"
for cmd in sbatch srun salloc sacct sacctmgr squeue scancel scontrol sinfo sstat sshare; do
    real=$(command -v "$cmd") || continue
    printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$SLURM_CONF" "$real" >"$DIR/bin/$cmd"
    chmod 755 "$DIR/bin/$cmd"
done
cat >"$DIR/env" <<EOF
SLURM_CONF=$SLURM_CONF
SLURM_TEST_BIN=$DIR/bin
SLURM_TEST_PARTITION=$PARTITION
SLURM_TEST_CLUSTER=$CLUSTER
EOF

start slurmdbd slurmdbd -D
wait_for slurmdbd 60 sacctmgr -n list cluster
sacctmgr -i add cluster "$CLUSTER" >"$DIR/log/sacctmgr.log" 2>&1 ||
    fail "sacctmgr add cluster failed; see $DIR/log/sacctmgr.log"
start slurmctld slurmctld -D -i -f "$SLURM_CONF"
wait_for slurmctld 60 scontrol ping
start slurmd slurmd -D -f "$SLURM_CONF" -N "$NODE"
idle() { [ "$(sinfo -h -N -n "$NODE" -o %t)" = idle ]; }
wait_for slurmd 60 idle
echo "slurm-up: cluster $CLUSTER up in $DIR (partition $PARTITION, node $NODE, ${NCPU} CPUs, 1 fake GPU)" >&2
