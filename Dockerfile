# Dockerfile: moe-genomics on Debian 12. The first stage installs the build's Debian packages
# (`make deps`) and builds the Debian package (`make deb`, the CPU build); the second installs
# that .deb into a slim Debian 12 image, so the image holds the tools and their runtime
# libraries only. UNTESTED: Docker is not available where this project is developed and
# tested; the package build itself is tested by tests/e2e/package.sh.
#
#   docker build -t moe-genomics:0.1.0 .
#   docker run --rm -v "$PWD":/data -w /data moe-genomics:0.1.0 moe-tokenize genome.fa.gz -o shards/
FROM debian:12 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src/moe-genomics
COPY . .
RUN make deps && make deb

FROM debian:12-slim
COPY --from=build /src/moe-genomics_*.deb /tmp/
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        /tmp/moe-genomics_*.deb && rm -rf /var/lib/apt/lists/* /tmp/*.deb
CMD ["moe-train", "--help"]
