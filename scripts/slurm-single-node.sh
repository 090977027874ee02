#!/usr/bin/env bash
# Single-node SLURM (Debian bookworm's slurm-wlm 22.05) + munge for testing pserver (root).
#
#   bash scripts/slurm-single-node.sh install      # apt-get install slurmctld slurmd slurm-client munge
#   bash scripts/slurm-single-node.sh start        # write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd
#   bash scripts/slurm-single-node.sh stop         # stop the three daemons by their PID files
#
# Environment:
#   NODE_CPUS   CPUs declared for the node (default 2 = the real core count). A value above the
#               real count needs SlurmdParameters=config_overrides, which this script then adds.
#   OVERSUB     partition OverSubscribe= value (default FORCE:8)
#   SELECT      select plugin (default select/linear)
#   SELECT_PARAMS  SelectTypeParameters (default: none for select/linear, CR_CPU otherwise)
#
# The two configurations tested:
#   bash scripts/slurm-single-node.sh start                      # CPUs=2, select/linear: 7 tasks need
#        sbatch/srun --overcommit (-O); cons_tres refuses --ntasks-per-node > CPUs even with -O
#   NODE_CPUS=16 SELECT=select/cons_tres bash scripts/slurm-single-node.sh start   # a "16-core" node:
#        the docs' sbatch --nodes=1 --ntasks=7 --ntasks-per-node=7 works unchanged
#
# Everything (state, spool, logs, PID files) lives under $BASE (default $TMPDIR/pserver-slurm). Daemons
# run as root; all of SLURM's traffic goes to 127.0.0.1 (SlurmctldHost and NodeAddr).
set -euo pipefail
BASE=${BASE:-${TMPDIR:-/tmp}/pserver-slurm}
NODE=$(hostname)
NODE_CPUS=${NODE_CPUS:-2}
OVERSUB=${OVERSUB:-FORCE:8}
SELECT=${SELECT:-select/linear}
if [ "$SELECT" = select/linear ]; then SELECT_PARAMS=${SELECT_PARAMS-}; else SELECT_PARAMS=${SELECT_PARAMS-CR_CPU}; fi
REAL_CPUS=$(nproc)

install_pkgs() {
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge
}

write_conf() {
    mkdir -p "$BASE"/{state,spool,log,run} /etc/slurm
    local overrides=""
    if [ "$NODE_CPUS" -gt "$REAL_CPUS" ]; then overrides="SlurmdParameters=config_overrides"; fi
    local mem
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
    cat > /etc/slurm/slurm.conf <<EOF
# Minimal single-node test cluster (written by slurm-single-node.sh)
ClusterName=pstest
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=${SELECT}
${SELECT_PARAMS:+SelectTypeParameters=$SELECT_PARAMS}
ReturnToService=2
StateSaveLocation=${BASE}/state
SlurmdSpoolDir=${BASE}/spool
SlurmctldPidFile=${BASE}/run/slurmctld.pid
SlurmdPidFile=${BASE}/run/slurmd.pid
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${BASE}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
KillWait=10
${overrides}
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${NODE_CPUS} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=${OVERSUB}
EOF
}

start() {
    write_conf
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    [ -s /etc/munge/munge.key ] || runuser -u munge -- /usr/sbin/mungekey --verbose
    if ! { [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
        runuser -u munge -- /usr/sbin/munged
    fi
    munge -n | unmunge | grep -q 'STATUS: *Success'
    /usr/sbin/slurmctld        # daemonizes; PID in $BASE/run/slurmctld.pid
    sleep 2
    /usr/sbin/slurmd           # daemonizes; PID in $BASE/run/slurmd.pid
    for _ in $(seq 30); do
        if sinfo -h -o '%T' | grep -qE '^(idle|mixed|allocated)'; then break; fi
        sleep 1
    done
    sinfo
}

stop() {
    for f in "$BASE/run/slurmd.pid" "$BASE/run/slurmctld.pid" /run/munge/munged.pid; do
        if [ -f "$f" ]; then
            pid=$(cat "$f")
            if kill -0 "$pid" 2>/dev/null; then kill "$pid"; echo "stopped $f ($pid)"; fi
        fi
    done
}

case ${1:-start} in
    install) install_pkgs ;;
    conf) write_conf; cat /etc/slurm/slurm.conf ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 install|conf|start|stop" >&2; exit 2 ;;
esac
