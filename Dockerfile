# Both binaries in one small image. Not built in CI (the development machines have no container
# engine); the chart's tests run the same binaries as local processes.
#
#   docker build -t sharder:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sharder-webhook -p sharder-reconciler -p sharder-example \
 && mkdir /out \
 && cp target/release/sharder-webhook target/release/sharder-reconciler target/release/checksum-controller /out/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/sharder-webhook"]
