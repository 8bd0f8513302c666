# The README's commands. Everything here also works on a fresh Debian machine: the control plane
# binaries are provisioned (and cached outside the repository) on first use.

CARGO ?= cargo

.PHONY: demo demo-cluster test bench bench-scale lint crd control-plane helm image

## The demo: a local control plane, the webhook, the reconciler and three example shards as
## processes; 100 objects assigned, a fourth shard added (drains and moves shown from the logs),
## a shard crashed and its objects reassigned. Ctrl-C stops everything.
demo: control-plane
	$(CARGO) build --locked --quiet --bins -p sharder-webhook -p sharder-reconciler -p sharder-example -p sharder-tests
	$(CARGO) run --locked --quiet -p sharder-tests --bin demo

## The same product as users install it, on a real single-node cluster on this machine (kubelet,
## containerd, kube-proxy and kube-scheduler from Debian's packages and sources): the image built
## from this checkout, `helm install`, the example shards as a StatefulSet, then scale-out, leader
## failover, a rolling update of the shards, a shard killed hard, upgrade and uninstall, with
## every kubectl and helm command printed. Needs root (bridge, iptables, cgroups); everything is
## removed at the end.
demo-cluster: control-plane helm
	$(CARGO) test --locked -p sharder-tests --test e2e a_real_node -- --nocapture

## The image (webhook, reconciler, example shard) from a release build of this checkout, without a
## container engine: target/image/sharder-<version>.tar (docker-archive; `docker load` or
## `ctr images import` it). With a container engine: docker build -t sharder:0.1.0 .
image: control-plane
	bash harness/image/build.sh

## Runs every test: the pure unit and property tests and the tests against a real local
## kube-apiserver + etcd (provisioned first if needed). Built once, then run in two lanes side by
## side (the end-to-end tests, every other crate's) with at least 3 tests at a time in each test
## binary, even on 2 cores, which they keep busy (harness/run-tests.sh). One binary alone:
## cargo test -p <crate> --test <name>.
test: control-plane helm
	CARGO=$(CARGO) bash harness/run-tests.sh

## The benchmarks (release build), every section in one run of about 40 minutes on 2 cores:
## webhook latency through the apiserver and under load, reconciler memory against object
## count, a scale-out of Pods in chains, rebalancing, shard crashes, rolling updates, the ring, the chart's pods on a real node
## (root: a bridge, iptables, cgroups; --sections leaves it out), the idle cost, range mode
## beside label mode, and Sharder beside the reference's own binary (BENCH_ARGS="--reference <its sharder binary>
## --reference-version <its release>", built by you; without it Sharder's figures stand
## alone). Progress on stderr; each section is in docs/benchmarks.md as soon as it ends. One
## row again: make bench BENCH_ARGS="--sections memory --sizes 10000 --output /tmp/b.md".
BENCH_ARGS ?=
# The bench and every binary it runs, built before it starts (its clock measures no build).
BENCH_PACKAGES = -p sharder-bench -p sharder-webhook -p sharder-reconciler -p sharder-example -p sharder-harness
bench: control-plane helm
	$(CARGO) build --release --locked --quiet --bins $(BENCH_PACKAGES)
	SHARDER_BINARIES=$(CURDIR)/target/release $(CARGO) run --release --locked --quiet -p sharder-bench --bin sharder-bench -- $(BENCH_ARGS)

## The larger size (100,000 objects; about 20 minutes on 2 cores): section 9, both contenders'
## CREATE latency, memory and scale-out, one round each, into docs/benchmarks-scale.md (the
## default report never mixes runs). BENCH_ARGS as for bench.
bench-scale: control-plane helm
	$(CARGO) build --release --locked --quiet --bins $(BENCH_PACKAGES)
	SHARDER_BINARIES=$(CURDIR)/target/release $(CARGO) run --release --locked --quiet -p sharder-bench --bin sharder-bench -- \
		--sections reference --reference-sizes 100000 --reference-rounds 1 --reference-scale-out-only \
		--output docs/benchmarks-scale.md $(BENCH_ARGS)

## Formatting and lints, as CI runs them.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## Regenerates the ClusterRing and ControllerRing CRDs in the chart from the Rust types.
crd:
	$(CARGO) run --quiet --locked -p sharder-common --example crd clusterring > charts/sharder/crds/clusterrings.sharding.timebertt.dev.yaml
	$(CARGO) run --quiet --locked -p sharder-common --example crd controllerring > charts/sharder/crds/controllerrings.sharding.timebertt.dev.yaml

## Provisions etcd, the Kubernetes binaries (built once per machine, cached under
## ~/.cache/sharder) and the node's Debian packages (containerd, runc, CNI plugins, iptables,
## umoci, skopeo).
control-plane:
	bash harness/control-plane/provision.sh

## Installs Helm for the chart tests (the Helm v4 SDK from PyPI's helm-python-sdk, cached under
## ~/.cache/sharder).
helm:
	bash harness/helm/provision.sh
