#!/bin/sh
# Runs inside the guest, chrooted into the host's root: loads Soft-RoCE,
# brings up rxe0, runs the commands, writes the result to $WORK/rc.
WORK=$(dirname "$0")
. "$WORK/env"
m() { /sbin/modprobe -d "$KDIR" "$@" || echo "guest: modprobe $* failed"; }
# vgem: a virtual GEM device whose buffers export as real dma-bufs (this
# kernel has no udmabuf), for the dma-buf registration test.
for mod in virtio_net crc32_generic rdma_rxe ib_uverbs rdma_ucm vgem; do m "$mod"; done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "guest: rdma link add failed"
echo "guest: $(ibv_devices | tail -n +3 | awk '{print $1}' | tr '\n' ' ')"
cd "$PROJECT"
# /run is a tmpfs in the guest (the host's root is read-only there).
mkdir -p /run/sluice-tmp
export HOME=/run/sluice-tmp TMPDIR=/run/sluice-tmp SLUICE_RXE_DEVICE=rxe0
rc=0
while IFS= read -r cmd; do
  [ -n "$cmd" ] || continue
  echo "guest: \$ $cmd"
  eval "$cmd"
  status=$?
  echo "guest: exit $status"
  [ $status -eq 0 ] || [ $rc -ne 0 ] || rc=$status
done < "$WORK/commands"
echo "$rc" > "$WORK/rc"
