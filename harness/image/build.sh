#!/usr/bin/env bash
# Builds Sharder's one image (sharder-webhook, sharder-reconciler and the example shard
# checksum-controller at /, run as the nonroot user 65532, entrypoint /sharder-webhook: the
# Dockerfile's runtime stage) without a container engine, as a docker-archive that `docker load`,
# `ctr images import` and `skopeo` read.
#
# The base layer is assembled from Debian packages (libc6, libgcc-s1: what the binaries link,
# plus passwd/group entries for nonroot), the counterpart of distroless/cc-debian12:nonroot for
# machines without a registry. It is packed with umoci and skopeo (Debian packages, installed by
# harness/control-plane/provision.sh).
#
#   harness/image/build.sh [--binaries DIR] [--tag TAG] [--out DIR] [--pause BIN]
#
# --binaries: the folder holding the three binaries (default: a release build of this checkout).
# --pause: also build `sharder-pause:TAG` (the pod sandbox image a local node needs) from BIN.
# The last lines on stdout are the archives written. Progress goes to stderr.
set -euo pipefail

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

root=$(cd "$(dirname "$0")/../.." && pwd)
binaries=""
tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/sharder/Chart.yaml")
out="$root/target/image"
pause=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries) binaries="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --pause) pause="$2"; shift 2 ;;
    *) die "unknown argument '$1' (expected --binaries DIR, --tag TAG, --out DIR, --pause BIN)" ;;
  esac
done
[ -n "$tag" ] || die "no --tag and no appVersion in charts/sharder/Chart.yaml"
for tool in umoci skopeo strip dpkg-deb apt-get; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is missing (run: bash harness/control-plane/provision.sh)"
done

if [ -z "$binaries" ]; then
  log "cargo build --release (sharder-webhook, sharder-reconciler, checksum-controller)"
  (cd "$root" && cargo build --release --locked --quiet -p sharder-webhook -p sharder-reconciler -p sharder-example >&2)
  binaries="$root/target/release"
fi
BINS=(sharder-webhook sharder-reconciler checksum-controller)
for bin in "${BINS[@]}"; do
  [ -x "$binaries/$bin" ] || die "--binaries $binaries has no executable '$bin'"
done

# The base: Debian's libc6 and libgcc-s1 unpacked, cached per package version.
cache="${SHARDER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sharder}/image-base"
versions=$(apt-cache policy libc6 libgcc-s1 | awk '/Candidate:/ {print $2}' | tr '\n' '_')
base="$cache/$versions/rootfs"
if [ ! -d "$base" ]; then
  log "assembling the base layer from Debian's libc6 and libgcc-s1 into $base"
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download libc6 libgcc-s1 >&2) || die "apt-get download libc6 libgcc-s1 failed"
  # A folder of this build's own, renamed into place at the end: two builds at once (two test
  # binaries starting their nodes) each assemble one and the first rename wins.
  mkdir -p "$(dirname "$base")"
  tmp=$(mktemp -d "$base.XXXXXX")
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$tmp"; done
  rm -rf "$debs" "$tmp/usr/share/doc" "$tmp/usr/share/lintian" "$tmp/usr/share/locale"
  mkdir -p "$tmp/etc" "$tmp/tmp" "$tmp/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tmp/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/etc/group"
  chmod 1777 "$tmp/tmp"
  chown 65532:65532 "$tmp/home/nonroot"
  chmod 0755 "$tmp"
  mv -T "$tmp" "$base" 2>/dev/null || rm -rf "$tmp"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# pack NAME ENTRYPOINT USER ROOTFS: writes $out/NAME-$tag.tar holding the image NAME:$tag.
pack() {
  local name=$1 entrypoint=$2 user=$3 rootfs=$4 layout="$work/oci-$1"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" "$rootfs" /
  umoci config --image "$layout:$tag" --config.user "$user" --config.entrypoint "$entrypoint" \
    --config.workingdir / --config.env PATH=/ --author sharder
  local archive="$out/$name-$tag.tar"
  rm -f "$archive"
  skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$archive:$name:$tag" >&2
  log "wrote $archive ($name:$tag, $(du -h "$archive" | cut -f1))"
  echo "$archive"
}

rootfs="$work/rootfs"
cp -a "$base" "$rootfs"
for bin in "${BINS[@]}"; do
  strip -o "$rootfs/$bin" "$binaries/$bin"
  chmod 0755 "$rootfs/$bin"
done
pack sharder /sharder-webhook 65532:65532 "$rootfs"

if [ -n "$pause" ]; then
  [ -x "$pause" ] || die "--pause $pause is not an executable"
  pause_root="$work/pause-rootfs"
  cp -a "$base" "$pause_root"
  strip -o "$pause_root/pause" "$pause"
  chmod 0755 "$pause_root/pause"
  pack sharder-pause /pause 65532:65532 "$pause_root"
fi
