#!/usr/bin/env bash
# Provisions the binaries of a real local Kubernetes cluster for Sharder's tests and demo:
# etcd (Debian's etcd-server); kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy and kubectl built from Debian's kubernetes source package (as described in
# shared/control-plane.md); and what a node needs from Debian: containerd, runc, the CNI plugins,
# iptables, conntrack, and umoci + skopeo to build images without a container engine.
#
# The build is cached outside the repository, keyed by version and recipe, so only the first run on
# a machine pays for it. When KUBEBUILDER_ASSETS names a folder holding `etcd` and
# `kube-apiserver`, those binaries are used and nothing is built (a node then also needs
# kube-scheduler, kubelet and kube-proxy there).
#
# On success the last line printed on stdout is the assets folder. Progress goes to stderr.
set -euo pipefail

log() { printf '[provision] %s\n' "$*" >&2; }
die() { printf '[provision] error: %s\n' "$*" >&2; exit 1; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  for bin in etcd kube-apiserver; do
    [ -x "$KUBEBUILDER_ASSETS/$bin" ] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$bin'"
  done
  log "using binaries from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

K8S_VERSION="${SHARDER_K8S_VERSION:-1.20.2}"
# Bumped whenever the build recipe (the source fixes below) changes, so caches rebuild.
RECIPE=3
CACHE_ROOT="${SHARDER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sharder}"
ASSETS="$CACHE_ROOT/k8s-$K8S_VERSION-r$RECIPE/bin"

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" -eq 0 ]; then
    log "apt-get update"
    sudo_if_needed apt-get update -qq >&2
    apt_updated=1
  fi
}

# Everything built from the source package, in build order (the later ones reuse the Go cache).
BUILT=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
all_built() {
  local what
  for what in "${BUILT[@]}"; do [ -x "$ASSETS/$what" ] || return 1; done
}

need_pkgs=()
command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
# The node: container runtime, pod network, service proxy, and the image tools.
command -v containerd >/dev/null 2>&1 || need_pkgs+=(containerd)
command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] || need_pkgs+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need_pkgs+=(iptables)
command -v conntrack >/dev/null 2>&1 || need_pkgs+=(conntrack)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v umoci >/dev/null 2>&1 || need_pkgs+=(umoci)
command -v skopeo >/dev/null 2>&1 || need_pkgs+=(skopeo)
if ! all_built; then
  command -v go >/dev/null 2>&1 || need_pkgs+=(golang-go)
  command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
  [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_pkgs+=(golang-github-modern-go-reflect2-dev)
  command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  apt_update_once
  log "installing Debian packages: ${need_pkgs[*]}"
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi

mkdir -p "$ASSETS"
ln -sf "$(command -v etcd)" "$ASSETS/etcd"

if all_built; then
  log "cached ${BUILT[*]} $K8S_VERSION in $ASSETS"
  echo "$ASSETS"
  exit 0
fi

# Debian's source package of kubernetes ships vendor/, so the build needs no module download.
src_list=/etc/apt/sources.list.d/sharder-deb-src.sources
if ! apt-get source --print-uris kubernetes >/dev/null 2>&1; then
  mirror=$(grep -hoE '^URIs:[[:space:]]*\S+/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')
  [ -n "$mirror" ] || mirror=$(grep -hoE '^deb[[:space:]]+\S+/debian/?[[:space:]]' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}')
  [ -n "$mirror" ] || die "cannot find the Debian mirror this machine uses (looked in /etc/apt/sources.list{,.d})"
  log "adding deb-src for bookworm main from $mirror"
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" | sudo_if_needed tee "$src_list" >/dev/null
  apt_updated=0
  apt_update_once
fi

work="$CACHE_ROOT/k8s-$K8S_VERSION-r$RECIPE/src"
rm -rf "$work"
mkdir -p "$work"
log "downloading Debian's kubernetes source package into $work"
(cd "$work" && apt-get source --download-only kubernetes >&2)
orig=$(ls "$work"/kubernetes_*.orig.tar.gz 2>/dev/null | head -n1)
[ -n "$orig" ] || die "apt-get source kubernetes gave no kubernetes_*.orig.tar.gz"
case "$orig" in
  *"_$K8S_VERSION.orig.tar.gz" | *"really$K8S_VERSION.orig.tar.gz") ;;
  *) die "Debian's kubernetes source is $(basename "$orig"), expected version $K8S_VERSION (set SHARDER_K8S_VERSION)" ;;
esac
tar -xzf "$orig" -C "$work"
tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n1)
[ -f "$tree/Makefile" ] || die "unpacked source in $tree has no Makefile"

# Kubernetes 1.20 vendors modern-go/reflect2 v1.0.1, which crashes under Go >= 1.18
# (fatal error: fault in mapiterinit). Debian ships the fixed 1.0.2.
log "replacing vendored modern-go/reflect2 with Debian's fixed version"
find "$tree/vendor/github.com/modern-go/reflect2" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$tree/vendor/github.com/modern-go/reflect2/"
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$tree/vendor/github.com/modern-go/reflect2/" 2>/dev/null || true
rm -f "$tree"/vendor/github.com/modern-go/reflect2/*_test.go

# The OpenAPI type validator of CRDs asks "is this a zero value?" with
# reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(data)), comparing two reflect.Value structs.
# Under Go >= 1.18 zero values share one pointer, so every "", 0 and false in a custom resource is
# rejected as "null" (e.g. `group: ""`, `message: ""`). Restore the meaning it had under older Go:
# only a nil value is null.
zero_check='data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))'
patched=0
for f in "$tree/vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go" \
         "$tree/vendor/github.com/go-openapi/validate/type.go"; do
  if [ -f "$f" ] && grep -qF "$zero_check" "$f"; then
    log "fixing the zero-value type check in ${f#"$tree"/}"
    sed -i "s/data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))/data == nil/" "$f"
    patched=$((patched + 1))
  fi
done
[ "$patched" -gt 0 ] || die "the zero-value type check to fix was not found in vendor/ (recipe out of date)"

mkdir -p "$tree/.go/src/k8s.io"
ln -sfn ../../.. "$tree/.go/src/k8s.io/kubernetes"
for what in "${BUILT[@]}"; do
  [ -x "$ASSETS/$what" ] && continue
  log "building $what $K8S_VERSION (first run on this machine only; about 7 minutes for all on 2 cores)"
  (cd "$tree" && GOPATH="$tree/.go" CGO_ENABLED=0 \
    make WHAT="cmd/$what" >&2)
  cp "$tree/_output/bin/$what" "$ASSETS/$what.tmp"
  mv "$ASSETS/$what.tmp" "$ASSETS/$what"
done
rm -rf "$work"
log "built into $ASSETS"
echo "$ASSETS"
