#!/usr/bin/env bash
# `make test`: builds every target of the workspace once, the tests and the product's binaries in
# one feature resolution (`cargo build --workspace --all-targets`; the end-to-end tests take the
# binaries from there through SHARDER_BINARIES instead of building them again without the
# dev-dependencies' features), then runs the test binaries in two lanes side by side, as cargo
# would run them (from their package's folder), each line prefixed with its lane:
#   e2e    sharder-tests (the end-to-end tests, the journey on the real node first), then the
#          harness's control plane tests, the runtime's Lease tests and the webhook's cluster
#          tests;
#   crates every other crate's binaries in cargo's order (the bench's smoke test last: its real
#          node waits for the journey's), and the doc tests first.
# Each binary starts its own control plane. Two lanes of at least 3 tests each keep 2 cores busy
# (a request may then wait seconds for a core: the tests' Leases allow for it; performance-notes,
# "make test saturates both cores"). Exits non-zero if any binary failed; the summary at the end
# names them. RUST_TEST_THREADS overrides the tests per binary.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO="${CARGO:-cargo}"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-$(( $(nproc) > 3 ? $(nproc) : 3 ))}"

plan=$(mktemp -d)
trap 'rm -rf "$plan"' EXIT

"$CARGO" build --workspace --all-targets --locked --message-format=json-render-diagnostics \
  > "$plan/build.json"

# Lane files: one "<package folder>\t<executable>\t<name>" per line, in cargo's order.
python3 - "$plan" <<'EOF'
import json, os, sys

plan = sys.argv[1]
binaries = []  # (name as "<package folder>:<target>", package folder, executable)
for line in open(os.path.join(plan, "build.json")):
    message = json.loads(line)
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    package = os.path.dirname(message["manifest_path"])
    kind = message["target"]["kind"]
    if not message["profile"]["test"]:
        if kind == ["bin"]:  # the product's binaries, where the harness takes them from
            with open(os.path.join(plan, "binaries"), "w") as out:
                out.write(os.path.dirname(message["executable"]))
    elif kind != ["bench"]:  # what `cargo test` runs; benchmarks are `cargo bench`'s
        name = f"{os.path.basename(package)}:{message['target']['name']}"
        binaries.append((name, package, message["executable"]))
# By name, the bench smoke test last (sort is stable).
binaries.sort()
binaries.sort(key=lambda b: b[0] == "bench:smoke")
# These run in the end-to-end lane, after its binaries, to even the lanes (the crates lane, with
# the bench smoke, is the longer one: docs/performance-notes.md, "Where make test's CPU goes").
late_in_e2e = ("harness:control_plane", "runtime:lease", "webhook:cluster")
e2e = [b for b in binaries if b[0].startswith("tests:")]
e2e += [b for b in binaries if b[0] in late_in_e2e]
crates = [b for b in binaries if b not in e2e]
for lane, members in (("e2e", e2e), ("crates", crates)):
    with open(os.path.join(plan, lane), "w") as out:
        for name, package, executable in members:
            out.write(f"{package}\t{executable}\t{name}\n")
EOF

# Runs the binaries of lane file $1 one after another; a failed one is noted in $plan/failed and
# its output kept in $plan/<binary>.log for the summary.
lane() {
  local package executable binary started
  while IFS=$'\t' read -r package executable binary; do
    started=$(date +%s)
    echo "=== $binary ($(date -u +%H:%M:%S))"
    if ! (cd "$package" && "$executable") < /dev/null 2>&1 | tee "$plan/$binary.log"; then
      echo "$binary" >> "$plan/failed"
    fi
    echo "=== $binary: $(( $(date +%s) - started )) s"
  done < "$1"
}

prefix() { sed -u "s/^/[$1] /"; }

SHARDER_BINARIES=$(cat "$plan/binaries")
export SHARDER_BINARIES

started=$(date +%s)
lane "$plan/e2e" 2>&1 | prefix e2e &
e2e=$!
{
  echo "=== doc tests"
  "$CARGO" test --workspace --locked --doc || echo "doc tests" >> "$plan/failed"
  lane "$plan/crates"
} 2>&1 | prefix crates &
crates=$!
wait "$e2e" "$crates"

echo "=== every test binary ran in $(( $(date +%s) - started )) s"
if [ -s "$plan/failed" ]; then
  # Each failure's panic again, last: in a long log the lines above are far from its tail.
  while read -r binary; do
    echo "=== $binary failed:"
    grep -A 12 -e '^---- ' -e 'panicked at' "$plan/$binary.log" 2>/dev/null | head -80 || true
  done < "$plan/failed"
  echo "=== failed:"
  sed 's/^/  /' "$plan/failed"
  exit 1
fi
