#!/usr/bin/env bash
# The host side of the test node (harness/src/node.rs): what kubelet, kube-proxy, containerd and
# the CNI plugins need from the machine, and the removal of everything they leave behind.
#
#   host.sh prepare DIR PAUSE_IMAGE   record the host's state, create the pod bridge, write configs
#   host.sh clean DIR                 stop whatever a run under DIR left (also after a crash) and
#                                     put the host back as `prepare` found it; removes DIR
#
# Nothing listens on or routes through the machine's external interfaces: the pod network is the
# bridge below, and the apiserver and kubelet are bound to its gateway address.
set -euo pipefail

BRIDGE=sharder0
GATEWAY=10.244.0.1
POD_RANGE=10.244.0.0/24
# Set by kubelet, kube-proxy and the CNI bridge plugin; restored by `clean`.
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet)
# Paths kubelet, containerd and the CNI plugins write outside DIR; removed by `clean` when
# `prepare` did not find them.
HOST_PATHS=(/var/log/pods /var/log/containers /var/lib/kubelet /run/containerd /var/lib/cni
  /usr/libexec/kubernetes /etc/cni)

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "a node needs root (kubelet, containerd, iptables and bridges)"
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: host.sh prepare DIR PAUSE_IMAGE | host.sh clean DIR"
case "$dir" in /*) ;; *) die "DIR must be an absolute path, got '$dir'" ;; esac

# The ids of the containers and sandboxes a run under DIR created (runc's and containerd's state).
container_ids() {
  ls "$dir/runc/k8s.io" "$dir/containerd/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null |
    grep -E '^[0-9a-f]{64}$' | sort -u
}

# Processes of DIR's containers (by their cgroups: a container's processes may outlive its shim),
# and those whose command line names DIR (containerd, its shims, kubelet).
stop_processes() {
  local pid id pids=()
  for id in $(container_ids); do
    for procs in /sys/fs/cgroup/pids/k8s.io/"$id"/cgroup.procs /sys/fs/cgroup/unified/k8s.io/"$id"/cgroup.procs; do
      [ -f "$procs" ] && pids+=($(cat "$procs"))
    done
  done
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    if tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -qF -- "$dir/"; then
      pids+=("$pid")
    fi
  done
  if [ "${#pids[@]}" -gt 0 ]; then
    log "stopping ${#pids[@]} processes left under $dir"
    kill -9 "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      local alive=0
      for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && alive=1; done
      [ "$alive" -eq 0 ] && break
      sleep 0.1
    done
  fi
}

unmount_under() {
  local prefix=$1
  # Deepest first; lazily, so a busy mount does not stop the rest.
  awk -v p="$prefix" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo |
    sort -r | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
}

remove_cgroups() {
  # The containers' cgroups in every hierarchy, then containerd's k8s.io parent if empty.
  local id hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    for id in $(container_ids); do
      [ -d "$hierarchy/k8s.io/$id" ] && rmdir "$hierarchy/k8s.io/$id" 2>/dev/null
    done
    [ -d "$hierarchy/k8s.io" ] && rmdir "$hierarchy/k8s.io" 2>/dev/null
  done
  return 0
}

remove_rules() {
  local save=$1 restore=$2 table
  command -v "$save" >/dev/null 2>&1 || return 0
  local rules
  for table in nat filter mangle; do
    rules=$("$save" -t "$table" 2>/dev/null) || continue
    if grep -qE '(KUBE|CNI)-' <<<"$rules"; then
      grep -vE '^:(KUBE|CNI)-|^-A (KUBE|CNI)-|-j (KUBE|CNI)-' <<<"$rules" | "$restore" -T "$table"
    fi
  done
}

clean() {
  [ -d "$dir" ] || return 0
  log "cleaning the node under $dir"
  stop_processes
  unmount_under "$dir"
  unmount_under /run/containerd
  unmount_under /var/lib/kubelet
  remove_cgroups
  remove_rules iptables-save iptables-restore
  remove_rules ip6tables-save ip6tables-restore
  ip link del "$BRIDGE" 2>/dev/null || true
  if [ -f "$dir/host/sysctls" ]; then
    while read -r key value; do sysctl -q -w "$key=$value" >/dev/null 2>&1 || true; done <"$dir/host/sysctls"
  fi
  if [ -f "$dir/host/absent-paths" ]; then
    while read -r path; do rm -rf "$path"; done <"$dir/host/absent-paths"
  fi
  rm -rf "$dir"
}

prepare() {
  local pause=${3:-}
  [ -n "$pause" ] || die "usage: host.sh prepare DIR PAUSE_IMAGE"
  for tool in containerd runc iptables ip conntrack; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is missing (run: bash harness/control-plane/provision.sh)"
  done
  [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge is missing (run: bash harness/control-plane/provision.sh)"
  clean
  mkdir -p "$dir/host" "$dir/cni/net.d" "$dir/cni/ipam" "$dir/logs"
  # The pods' CPU weight against the machine's other processes. kubelet runs with
  # --cgroups-per-qos=false here, so containerd's k8s.io cgroup (under the root, beside every
  # process of the machine, each of weight 1024) stands in for the kubepods cgroup; kubelet gives
  # that one 1024 per core of the node. At the default 1024 all pods together weigh as much as one
  # busy process: beside a loaded machine's dozen they got too little CPU to answer the
  # apiserver's webhook calls in time (cgroup v1; `clean` removes it).
  if [ -d /sys/fs/cgroup/cpu ]; then
    mkdir -p /sys/fs/cgroup/cpu/k8s.io
    echo $(($(nproc) * 1024)) >/sys/fs/cgroup/cpu/k8s.io/cpu.shares
  fi
  for key in "${SYSCTLS[@]}"; do
    printf '%s %s\n' "$key" "$(sysctl -n "$key")" >>"$dir/host/sysctls"
  done
  : >"$dir/host/absent-paths"
  for path in "${HOST_PATHS[@]}"; do
    [ -e "$path" ] || echo "$path" >>"$dir/host/absent-paths"
  done
  ip link add "$BRIDGE" type bridge
  ip addr add "$GATEWAY/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  cat >"$dir/cni/net.d/10-sharder.conflist" <<CONF
{
  "cniVersion": "0.4.0",
  "name": "sharder",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{ "subnet": "$POD_RANGE", "gateway": "$GATEWAY" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "loopback" }
  ]
}
CONF
  cat >"$dir/containerd.toml" <<CONF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$dir/containerd.sock"

[ttrpc]
  address = "$dir/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # Root here may lack CAP_SYS_RESOURCE: without this every sandbox fails in runc's nsexec.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "$dir/runc"
CONF
}

case "$cmd" in
  prepare) prepare "$@" ;;
  clean) clean ;;
  *) die "unknown command '$cmd' (prepare or clean)" ;;
esac
