#!/usr/bin/env bash
# Installs Helm (the real Helm v4 SDK, from PyPI's helm-python-sdk) for the chart tests, once per
# machine, into ~/.cache/sharder. Prints the folder to put on PYTHONPATH as its last line.
set -euo pipefail

VERSION=0.2.2
DIR="${SHARDER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sharder}/helm-python-$VERSION"

log() { echo "[helm] $*" >&2; }

if PYTHONPATH="$DIR" python3 -c 'import helm_python' >/dev/null 2>&1; then
  log "cached helm-python-sdk $VERSION in $DIR"
  echo "$DIR"
  exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  log "installing pip (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >&2
fi

log "installing helm-python-sdk $VERSION from PyPI into $DIR"
rm -rf "$DIR.tmp"
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --target "$DIR.tmp" "helm-python-sdk==$VERSION" >&2
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
PYTHONPATH="$DIR" python3 -c 'import helm_python as h; print("[helm] Helm SDK", h.helm_sdk_version())' >&2
echo "$DIR"
