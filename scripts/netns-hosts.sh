#!/usr/bin/env bash
# Three "hosts" h1..h3 as network namespaces on one machine, for multi-host MPI tests (root).
#
#   bash scripts/netns-hosts.sh up           # switch namespace + h1..h3, veth pairs, 10.213.7.0/24
#   bash scripts/netns-hosts.sh slow H RATE  # token-bucket (tbf) rate limit on host H's link,
#                                            # both directions, e.g. `slow h3 8mbit`
#   bash scripts/netns-hosts.sh delay H MS   # netem delay (needs the kernel's sch_netem)
#   bash scripts/netns-hosts.sh nodelay H    # remove either
#   bash scripts/netns-hosts.sh status
#   bash scripts/netns-hosts.sh kill         # end every process running on h1..h3
#   bash scripts/netns-hosts.sh down         # kill, then delete the namespaces (veths, bridge)
#
# Environment: NETNS_PREFIX (default "pserver-") prefixes every namespace name, so two sets of
# hosts on one machine do not collide (the hosts are still called h1..h3); NETNS_BIN (default
# $TMPDIR/${NETNS_PREFIX}netns) is where the helpers below are installed.
#
# Layout: the bridge br0 lives in its own namespace ${NETNS_PREFIX}sw, not in the root
# namespace, so the root namespace gets no interface, address or route: traffic between the
# hosts cannot leave the namespaces. Host hN has eth0 = 10.213.7.N/24 and lo, no default route.
# /etc/netns/${NETNS_PREFIX}hN/hosts (bind-mounted over /etc/hosts by `ip netns exec`) maps
# h1..h3 to their addresses, so each host resolves the others by name. The file system is
# shared: a virtual environment built in the root namespace runs unchanged on every host.
#
# Helpers, installed in $NETNS_BIN:
#   nsrun HOST CMD...  runs CMD "on" HOST: in its network namespace, with a private UTS
#                      namespace whose hostname is HOST (MPICH's Hydra groups ranks by hostname).
#   nsssh              an ssh stand-in for Hydra, which calls it as `nsssh [options] HOST CMD`:
#       $NETNS_BIN/nsrun h1 mpiexec -launcher ssh -launcher-exec $NETNS_BIN/nsssh -f HOSTFILE ...
#                      Every call is logged to $NETNS_BIN/nsssh.log.
set -euo pipefail
HOSTS=(h1 h2 h3)
NET=10.213.7
PREFIX=${NETNS_PREFIX:-pserver-}
SW=${PREFIX}sw
BIN=${NETNS_BIN:-${TMPDIR:-/tmp}/${PREFIX}netns}

install_helpers() {
    mkdir -p "$BIN"
    cat > "$BIN/nsrun" <<EOF
#!/bin/bash
# nsrun HOST CMD... : run CMD in network namespace ${PREFIX}HOST with hostname HOST.
host=\$1; shift
exec ip netns exec "${PREFIX}\$host" unshare --uts /bin/sh -c 'hostname "\$0" && exec "\$@"' "\$host" "\$@"
EOF
    cat > "$BIN/nsssh" <<'EOF'
#!/bin/bash
# ssh stand-in for MPICH Hydra: nsssh [ssh options] HOST COMMAND...
here=$(dirname "$(readlink -f "$0")")
while [ $# -gt 0 ]; do
    case $1 in
        -o|-p|-l|-i|-F) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=$1; shift
echo "$(date +%T.%N) nsssh $host: $*" >> "$here/nsssh.log"
case $host in h1|h2|h3) ;; *) echo "nsssh: unknown host $host" >&2; exit 255 ;; esac
exec "$here/nsrun" "$host" /bin/sh -c "$*"
EOF
    chmod +x "$BIN/nsrun" "$BIN/nsssh"
}

up() {
    install_helpers
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    local i=0
    for h in "${HOSTS[@]}"; do
        i=$((i + 1))
        ip netns add "$PREFIX$h"
        ip -n "$PREFIX$h" link set lo up
        # the veth pair is created inside the switch namespace, one end moved into the host
        ip -n "$SW" link add "sw-$h" type veth peer name eth0 netns "$PREFIX$h"
        ip -n "$SW" link set "sw-$h" master br0 up
        ip -n "$PREFIX$h" addr add "$NET.$i/24" dev eth0
        ip -n "$PREFIX$h" link set eth0 up
        mkdir -p "/etc/netns/$PREFIX$h"
        {
            echo "127.0.0.1 localhost"
            local j=0
            for g in "${HOSTS[@]}"; do j=$((j + 1)); echo "$NET.$j $g"; done
        } > "/etc/netns/$PREFIX$h/hosts"
    done
    status
}

# Both directions of host H's link get the same queueing discipline: eth0 inside the host
# shapes what it sends, sw-H in the switch what it receives.
shape() {
    local h=$1; shift
    ip -n "$PREFIX$h" link show eth0 >/dev/null
    tc -n "$PREFIX$h" qdisc replace dev eth0 root "$@"
    tc -n "$SW" qdisc replace dev "sw-$h" root "$@"
}

slow() { shape "$1" tbf rate "$2" burst 4kb latency 1s; }
delay() { shape "$1" netem delay "${2}ms"; }

nodelay() {
    local h=$1
    tc -n "$PREFIX$h" qdisc del dev eth0 root 2>/dev/null || true
    tc -n "$SW" qdisc del dev "sw-$h" root 2>/dev/null || true
}

status() {
    ip netns list
    for h in "${HOSTS[@]}"; do
        echo "== $h: $(ip -n "$PREFIX$h" -br addr show eth0)"
        tc -n "$PREFIX$h" qdisc show dev eth0
        tc -n "$SW" qdisc show dev "sw-$h"
    done
}

# End every process still running on the hosts (a hung job's ranks under the ssh stand-in):
# `ip netns pids` lists exactly the processes inside a namespace.
kill_all() {
    local ns pids
    for ns in "${HOSTS[@]/#/$PREFIX}" "$SW"; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
    done
}

down() {
    kill_all
    for h in "${HOSTS[@]}"; do
        ip netns del "$PREFIX$h" 2>/dev/null || true
        rm -rf "/etc/netns/$PREFIX$h"
    done
    ip netns del "$SW" 2>/dev/null || true
    rmdir /etc/netns 2>/dev/null || true
    rm -f "$BIN/nsrun" "$BIN/nsssh" "$BIN/nsssh.log"
    rmdir "$BIN" 2>/dev/null || true
}

case ${1:-} in
    up) up ;;
    down) down ;;
    kill) kill_all ;;
    delay) delay "$2" "$3" ;;
    slow) slow "$2" "$3" ;;
    nodelay) nodelay "$2" ;;
    status) status ;;
    helpers) install_helpers ;;
    *) echo "usage: $0 up|down|kill|helpers|slow HOST RATE|delay HOST MS|nodelay HOST|status" >&2; exit 2 ;;
esac
