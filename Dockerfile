# One image for all of Sharder: sharder-webhook, sharder-reconciler and the example shard
# checksum-controller at /, run as the nonroot user 65532 (the chart's securityContext: read-only
# root filesystem, no capabilities).
#
#   docker build -t sharder:0.1.0 .
#
# The runtime base is a build argument (distroless/cc-debian12:nonroot: glibc, libgcc and the
# nonroot user). Without a container engine, `make image` builds the same image from a local
# build with umoci and skopeo, on a base assembled from Debian's packages
# (harness/image/build.sh); that is the image the tests run on a real node.
ARG BASE=gcr.io/distroless/cc-debian12:nonroot

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sharder-webhook -p sharder-reconciler -p sharder-example \
 && mkdir /out \
 && cp target/release/sharder-webhook target/release/sharder-reconciler target/release/checksum-controller /out/

FROM ${BASE} AS runtime
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/sharder-webhook"]
