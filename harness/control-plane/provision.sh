#!/usr/bin/env bash
# Provisions the binaries of a real local Kubernetes cluster for Sharder's tests, demo and bench:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl of one
# Kubernetes release, and etcd at the minor that release ships with, all built with `go` from
# the Go module proxy; and what a node needs from Debian: containerd, runc, the CNI plugins,
# iptables, conntrack, and umoci + skopeo to build images without a container engine.
#
#   SHARDER_K8S_VERSION   the Kubernetes release (default below; `1.36` means its newest patch)
#   SHARDER_ETCD_VERSION  etcd's release (default: the newest patch of the minor the Kubernetes
#                         release names in its hack/lib/etcd.sh)
#   SHARDER_CACHE_DIR     where builds and Go's caches live (default ~/.cache/sharder)
#   KUBEBUILDER_ASSETS    a folder holding `etcd` and `kube-apiserver` (and, for a node,
#                         kube-scheduler, kubelet and kube-proxy): used as it is, nothing built
#
# Kubernetes' go.mod replaces each staging module (k8s.io/api, ...) with a folder of its own
# repository, so `go install k8s.io/kubernetes/cmd/...@version` refuses it. A wrapper module,
# generated here in the cache, requires k8s.io/kubernetes and replaces each staging module with
# its published v0.<minor>.<patch>; etcd gets a wrapper of its own (one build list would raise
# Kubernetes' etcd client, grpc and otel to etcd-server's). Both keep the upstream go and godebug
# lines and build as upstream does (-trimpath, the version ldflags, CGO off), so `/version` and
# `etcd --version` tell the truth.
#
# On success the last line printed on stdout is the assets folder. Progress goes to stderr.
set -euo pipefail

log() { printf '[provision] %s\n' "$*" >&2; }
die() { printf '[provision] error: %s\n' "$*" >&2; exit 1; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- The node's Debian packages (also with KUBEBUILDER_ASSETS: a node needs them either way).
need_pkgs=()
command -v containerd >/dev/null 2>&1 || need_pkgs+=(containerd)
command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] || need_pkgs+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need_pkgs+=(iptables)
command -v conntrack >/dev/null 2>&1 || need_pkgs+=(conntrack)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v umoci >/dev/null 2>&1 || need_pkgs+=(umoci)
command -v skopeo >/dev/null 2>&1 || need_pkgs+=(skopeo)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  log "installing Debian packages: ${need_pkgs[*]}"
  sudo_if_needed apt-get update -qq >&2
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  for bin in etcd kube-apiserver; do
    [ -x "$KUBEBUILDER_ASSETS/$bin" ] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$bin'"
  done
  log "using binaries from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

# Bumped whenever the build recipe (flags, wrapper, etcd choice) changes, so caches rebuild.
RECIPE=1
ASKED="${SHARDER_K8S_VERSION:-1.37.2}"
K8S_VERSION="v${ASKED#v}"
CACHE_ROOT="${SHARDER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sharder}"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

all_built() {
  local dir=$1 what
  for what in "${BINARIES[@]}" etcd; do [ -x "$dir/$what" ] || return 1; done
  [ -f "$dir/versions" ]
}

# A full version names its folder directly: a warm cache needs no Go and no network.
if [[ "$K8S_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] && [ -z "${SHARDER_ETCD_VERSION:-}" ]; then
  ASSETS="$CACHE_ROOT/k8s-$K8S_VERSION-r$RECIPE/bin"
  if all_built "$ASSETS"; then
    log "cached: $(paste -sd ' ' "$ASSETS/versions") in $ASSETS"
    echo "$ASSETS"
    exit 0
  fi
fi

command -v go >/dev/null 2>&1 ||
  die "'go' is missing: these machines carry Go 1.26 (Debian's golang-go is too old to build Kubernetes $K8S_VERSION)"

# Go's caches live beside the builds, so an empty SHARDER_CACHE_DIR is a truly cold build and
# removing it removes everything (-modcacherw: module files are writable, so rm -rf works).
export GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build"
export GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

# Runs one named step; on failure stops with the version, the step and the end of its output.
step() {
  local name=$1 out
  shift
  out=$(mktemp)
  if ! "$@" >"$out" 2>&1; then
    die "Kubernetes $K8S_VERSION: step '$name' failed:
$(tail -n 25 "$out")"
  fi
  rm -f "$out"
}

# The newest release of module $1 whose version starts with $2 (e.g. "v1.36."), prereleases
# left out.
newest() {
  go list -m -versions "$1" 2>/dev/null | tr ' ' '\n' | grep -E "^${2//./\\.}[0-9]+$" | sort -V | tail -n 1
}

if [[ "$K8S_VERSION" =~ ^v[0-9]+\.[0-9]+$ ]]; then
  resolved=$(newest k8s.io/kubernetes "$K8S_VERSION.")
  [ -n "$resolved" ] || die "the Go module proxy serves no release of Kubernetes $K8S_VERSION"
  log "Kubernetes $K8S_VERSION: its newest patch is $resolved"
  K8S_VERSION=$resolved
fi
[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] ||
  die "SHARDER_K8S_VERSION=$ASKED is not a release version such as 1.37.2 or 1.36"
K8S_MINOR=${BASH_REMATCH[1]}
STAGING_VERSION="v0.$K8S_MINOR.${BASH_REMATCH[2]}"

log "Kubernetes $K8S_VERSION: downloading k8s.io/kubernetes from the Go module proxy"
step "download k8s.io/kubernetes@$K8S_VERSION (is it served?)" \
  go mod download k8s.io/kubernetes@"$K8S_VERSION"
K8S_SRC="$GOMODCACHE/k8s.io/kubernetes@$K8S_VERSION"
K8S_GO=$(awk '$1 == "go" {print $2; exit}' "$K8S_SRC/go.mod")
K8S_GODEBUG=$(awk '$1 == "godebug" {print $2; exit}' "$K8S_SRC/go.mod")
[ -n "$K8S_GO" ] || die "Kubernetes $K8S_VERSION: its go.mod has no go line"

# Kubernetes needs at least the Go of its go line; the one approved newer toolchain is fetched
# from the proxy when this machine's is older.
have_go=$(go env GOVERSION)
have_go=${have_go#go}
if [ "$(printf '%s\n%s\n' "$K8S_GO" "$have_go" | sort -V | head -n 1)" != "$K8S_GO" ]; then
  log "Kubernetes $K8S_VERSION needs Go $K8S_GO, this machine has $have_go: using GOTOOLCHAIN=go1.27.3"
  export GOTOOLCHAIN=go1.27.3
fi

if [ -n "${SHARDER_ETCD_VERSION:-}" ]; then
  ETCD_VERSION="v${SHARDER_ETCD_VERSION#v}"
else
  shipped=$(sed -nE 's/^ETCD_VERSION=\$\{ETCD_VERSION:-([0-9]+\.[0-9]+)\.[0-9]+\}.*/\1/p' "$K8S_SRC/hack/lib/etcd.sh")
  [ -n "$shipped" ] || die "Kubernetes $K8S_VERSION: no ETCD_VERSION in hack/lib/etcd.sh"
  ETCD_VERSION=$(newest go.etcd.io/etcd/server/v3 "v$shipped.")
  [ -n "$ETCD_VERSION" ] || die "the Go module proxy serves no etcd $shipped.x (Kubernetes $K8S_VERSION ships with it)"
fi
# kube-apiserver serves consistent lists from its watch cache and streams lists only with an
# etcd that has watch progress requests: 3.5.13 and later.
[ "$(printf '%s\n%s\n' v3.5.13 "$ETCD_VERSION" | sort -V | head -n 1)" = v3.5.13 ] ||
  die "etcd $ETCD_VERSION is older than 3.5.13: kube-apiserver would read every consistent list from etcd"

ASSETS="$CACHE_ROOT/k8s-$K8S_VERSION-r$RECIPE/bin"
[ -z "${SHARDER_ETCD_VERSION:-}" ] || ASSETS="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-r$RECIPE/bin"
if all_built "$ASSETS"; then
  log "cached: $(paste -sd ' ' "$ASSETS/versions") in $ASSETS"
  echo "$ASSETS"
  exit 0
fi
mkdir -p "$ASSETS"

# Runs `go build` in the background and prints how long it has run every 30 s.
build() {
  local what=$1 out
  shift
  out=$(mktemp)
  local started=$SECONDS
  "$@" >"$out" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null && sleep 1; done
    kill -0 "$pid" 2>/dev/null && log "  still building $what ($((SECONDS - started)) s)"
  done
  if ! wait "$pid"; then
    die "Kubernetes $K8S_VERSION: step 'build $what' failed:
$(tail -n 25 "$out")"
  fi
  rm -f "$out"
  log "  built $what in $((SECONDS - started)) s"
}

# --- Kubernetes
wrapper="$CACHE_ROOT/modules/kubernetes-$K8S_VERSION-r$RECIPE"
rm -rf "$wrapper"
mkdir -p "$wrapper"
# Every staging module Kubernetes requires, at its published version; the tools to build.
staging=$(sed -n '/^require (/,/^)/p' "$K8S_SRC/go.mod" | awk '$2 == "v0.0.0" && $1 ~ /^k8s\.io\// {print $1}')
[ -n "$staging" ] || die "Kubernetes $K8S_VERSION: no staging module at v0.0.0 in its go.mod (recipe out of date)"
{
  printf 'module sharder.local/kubernetes-build\n\ngo %s\n' "$K8S_GO"
  [ -z "$K8S_GODEBUG" ] || printf '\ngodebug %s\n' "$K8S_GODEBUG"
  printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$K8S_VERSION"
  for module in $staging; do printf '\t%s => %s %s\n' "$module" "$module" "$STAGING_VERSION"; done
  printf ')\n\ntool (\n'
  for what in "${BINARIES[@]}"; do printf '\tk8s.io/kubernetes/cmd/%s\n' "$what"; done
  printf ')\n'
} >"$wrapper/go.mod"
log "Kubernetes $K8S_VERSION: resolving its build list (staging modules at $STAGING_VERSION, Go $K8S_GO)"
step "resolve the build list (are the staging modules at $STAGING_VERSION served?)" \
  bash -c "cd '$wrapper' && go mod tidy"

build_date=$(sed -nE 's/.*"Time":"([^"]+)".*/\1/p' "$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.info")
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
  ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit= -X $pkg.buildDate=${build_date:-unknown}"
done
for i in "${!BINARIES[@]}"; do
  what=${BINARIES[$i]}
  [ -x "$ASSETS/$what" ] && continue
  log "building $what $K8S_VERSION ($((i + 1)) of ${#BINARIES[@]}; the first takes minutes, the rest reuse its build cache)"
  build "$what" bash -c "cd '$wrapper' && go build -trimpath -tags selinux,notest -ldflags '$ldflags' -o '$ASSETS/$what.tmp' k8s.io/kubernetes/cmd/$what"
  mv "$ASSETS/$what.tmp" "$ASSETS/$what"
done

# --- etcd
etcd_wrapper="$CACHE_ROOT/modules/etcd-$ETCD_VERSION-r$RECIPE"
rm -rf "$etcd_wrapper"
mkdir -p "$etcd_wrapper"
ETCD_GO=$(go mod download -json go.etcd.io/etcd/server/v3@"$ETCD_VERSION" 2>/dev/null | sed -nE 's/.*"GoMod": "([^"]+)".*/\1/p')
[ -n "$ETCD_GO" ] || die "etcd $ETCD_VERSION: go.etcd.io/etcd/server/v3@$ETCD_VERSION is not served by the Go module proxy"
ETCD_GO=$(awk '$1 == "go" {print $2; exit}' "$ETCD_GO")
printf 'module sharder.local/etcd-build\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n\ntool go.etcd.io/etcd/server/v3\n' \
  "$ETCD_GO" "$ETCD_VERSION" >"$etcd_wrapper/go.mod"
log "etcd $ETCD_VERSION: resolving its build list"
step "resolve etcd $ETCD_VERSION's build list" bash -c "cd '$etcd_wrapper' && go mod tidy"
log "building etcd $ETCD_VERSION"
build etcd bash -c "cd '$etcd_wrapper' && go build -trimpath -ldflags '-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION' -o '$ASSETS/etcd.tmp' go.etcd.io/etcd/server/v3"
mv "$ASSETS/etcd.tmp" "$ASSETS/etcd"

# What was built, for logs and the benchmark report's versions table.
{
  "$ASSETS/kube-apiserver" --version
  "$ASSETS/etcd" --version | sed -n 1p
} >"$ASSETS/versions.tmp"
mv "$ASSETS/versions.tmp" "$ASSETS/versions"
log "built $(paste -sd ' ' "$ASSETS/versions") into $ASSETS"
echo "$ASSETS"
