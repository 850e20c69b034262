#!/bin/sh
# The rpmsg checks of tests/linux_rpmsg.rs, run inside the lab's User-Mode
# Linux (`scripts/linux-lab run -- rpmsg_guest.sh BIN STEP ...`), whose
# virtio_rpmsg_bus drives iopath's remote. BIN holds the programs the test
# built on the host (they run here as guest processes).
#
#   rpmsg_guest.sh BIN ctrl CHANNEL   rpmsg_echo through rpmsg_ctrl to the
#                                     announced CHANNEL
#   rpmsg_guest.sh BIN raw CHANNEL [MTU [BACK [TIMED...]]]
#                                     rpmsg_echo through the node rpmsg_char
#                                     made for the announced rpmsg-raw
#                                     CHANNEL (sizes up to MTU, then round
#                                     trips timed at each TIMED size), then
#                                     the kernel's rpmsg lines
#   rpmsg_guest.sh BIN sample MODULE  insmod rpmsg_client_sample (between
#                                     an unbind and a bind of the bus), wait
#                                     for its "goodbye!"
#   rpmsg_guest.sh BIN seed LOOPS     seed 002's program, both loops, its
#                                     calls tallied by ioctl_errno.so
#
# Prints the channels Linux saw ("channel NAME") and each program's output;
# exits non-zero when a step failed.
set -u
bin=$1 step=$2
shift 2

# Waits up to 20 s for path $1.
wait_for() {
    n=0
    while [ ! -e "$1" ]; do
        n=$((n + 1))
        [ $n -le 400 ] || { echo "guest: $1 never appeared"; return 1; }
        sleep 0.05
    done
}

# Waits up to 20 s for the rpmsg device named $1 (a channel the remote
# announced, or rpmsg_ctrl, which the bus makes itself).
wait_channel() {
    n=0
    until grep -qx "$1" /sys/bus/rpmsg/devices/*/name 2>/dev/null; do
        n=$((n + 1))
        [ $n -le 400 ] || { echo "guest: channel $1 never announced"; channels; return 1; }
        sleep 0.05
    done
}

channels() {
    for d in /sys/bus/rpmsg/devices/*; do
        [ -e "$d/name" ] && echo "channel $(cat "$d/name")"
    done
}

# rpmsg_char and rpmsg_ctrl, when the lab built them as modules: loaded
# after the announcements, so that rpmsg_char binds announced channels
# here, in process context.
load_rpmsg_char() {
    if [ ! -e /dev/rpmsg_ctrl0 ] && [ -n "${LAB_MODULES:-}" ]; then
        insmod "$LAB_MODULES/rpmsg_char.ko" && insmod "$LAB_MODULES/rpmsg_ctrl.ko" || return 1
    fi
    wait_for /dev/rpmsg_ctrl0
}

wait_channel rpmsg_ctrl || exit 1
case $step in
ctrl | raw)
    wait_channel "$1" || exit 1
    channels
    load_rpmsg_char || exit 1
    "$bin/rpmsg_echo" "$step" "$@"
    rc=$?
    # What the kernel said of the bus and of refused sends.
    dmesg | grep -E 'virtio_rpmsg_bus|message is too big|inbound msg too big' | sed 's/^\[[^]]*\] /kernel: /'
    exit $rc
    ;;
sample)
    wait_channel rpmsg-client-sample || exit 1
    channels
    # virtio_uml runs the virtqueue callbacks in its interrupt handler. A
    # sample probed here, in insmod's process context, would send its first
    # message holding the bus's tx_lock while the echo's interrupt arrives,
    # and the sample's callback, sending the next, would sleep on that lock
    # in the interrupt (scheduling while atomic, then a panic). So the bus
    # is unbound, the sample loaded, and the bus bound again: the device is
    # reset, the remote announces the channel to the new driver, and the
    # sample is probed from the name-service callback, in the same context
    # as all its other sends.
    vdev=$(basename "$(readlink -f /sys/bus/rpmsg/devices/*rpmsg-client-sample*/..)")
    drv=/sys/bus/virtio/drivers/virtio_rpmsg_bus
    echo "$vdev" >$drv/unbind || exit 1
    insmod "$1" || exit 1
    echo "$vdev" >$drv/bind || exit 1
    n=0
    until dmesg | grep -q 'rpmsg_client_sample.*goodbye!'; do
        n=$((n + 1))
        if [ $n -gt 600 ]; then
            dmesg | grep rpmsg_client_sample | tail -n 5
            echo "guest: no goodbye from rpmsg_client_sample within 30 s"
            exit 1
        fi
        sleep 0.05
    done
    # One "incoming msg N" line per echo, then the goodbye.
    dmesg | grep rpmsg_client_sample | sed 's/^\[[^]]*\] //'
    ;;
seed)
    channels
    load_rpmsg_char || exit 1
    # The program opens /dev/rpmsg0 for the endpoint it creates: no other
    # endpoint node may hold that name.
    if [ -e /dev/rpmsg0 ]; then
        echo "guest: /dev/rpmsg0 exists before the program ran"
        exit 1
    fi
    # Its output, then the tallies (on stderr at its exit), apart.
    LD_PRELOAD="$bin/ioctl_errno.so" "$bin/seed002" "$1" >"$bin/seed.out" 2>"$bin/seed.err"
    rc=$?
    cat "$bin/seed.out" "$bin/seed.err"
    exit $rc
    ;;
*)
    echo "guest: unknown step $step"
    exit 2
    ;;
esac
