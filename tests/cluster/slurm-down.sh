#!/usr/bin/env bash
# Stop the cluster that tests/cluster/slurm-up.sh started in DIR: cancel its jobs, then stop exactly
# the processes listed in DIR/run/daemons (name, PID, start time), newest first, and nothing else.
# Leaves DIR (logs, database) in place. Safe to run twice or after a failed bring-up.
set -uo pipefail

DIR=${1:?usage: slurm-down.sh DIR}
LIST=$DIR/run/daemons
[ -f "$LIST" ] || exit 0
export PATH="$PATH:/usr/sbin:/sbin"

# Jobs still queued or running on this cluster (a test that timed out): cancel them so that no
# slurmstepd outlives slurmd.
if grep -q '^slurmctld ' "$LIST" && [ -f "$DIR/etc/slurm.conf" ]; then
    SLURM_CONF=$DIR/etc/slurm.conf timeout 10 scancel --full --user "$(id -un)" >/dev/null 2>&1 || true
fi

# ours NAME PID STARTTIME: true while that PID is still the process we started.
ours() { [ "$(awk '{print $22}' "/proc/$2/stat" 2>/dev/null)" = "$3" ]; }

tac "$LIST" | while read -r name pid starttime; do
    ours "$name" "$pid" "$starttime" || continue
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do
        ours "$name" "$pid" "$starttime" || break
        # A zombie has exited; its parent reaps it.
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
        sleep 0.2
    done
    if ours "$name" "$pid" "$starttime" && [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ]; then
        echo "slurm-down: $name ($pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
done
: >"$LIST"
