# moe-genomics front door. Everything real happens in CMake (CMakeLists.txt); this file only
# names the everyday commands:
#   make deps       install the Debian packages the build, tests and demo need (once)
#   make            configure + build into build/
#   make test       deps, build (warnings are errors: MOE_WERROR=ON), run every test (ctest),
#                   output shown on failure; includes the package test (ctest -L package)
#   make test-asan  the same under AddressSanitizer + UBSan, in build-asan/
#   make install    build, then install into PREFIX (default /usr/local; DESTDIR is honoured):
#                   programs, man pages, bash completion, docs, configs, pipelines
#   make deb        the Debian package (CPU build) with dpkg-buildpackage, in ../
#   make dist       the release tarball moe-genomics-VERSION.tar.gz of the committed tree
#                   (git archive of HEAD) in DIST_DIR (default .), and its sha256
#   make fuzz       libFuzzer harnesses (tests/fuzz/, clang-14 + libfuzzer-14-dev) built in
#                   build-fuzz/ and run FUZZ_SECONDS (30) each, FUZZ_JOBS (one per core) at a
#                   time; `make test` ends with it when clang-14 and libFuzzer are installed
#   make demo       deps, build, then pipelines/quickstart.sh: lambda genome -> tokens ->
#                   tiny MoE training -> 1 kb embeddings, all under demo-out/ (a few minutes)
#   make bench      CPU benchmarks: bench/tokenize.sh and bench/train_cpu.sh (minutes; GPU
#                   benchmarks run on a GPU machine: bench/train_gpu.sh, docs/performance.md)
#   make clean      remove the build trees
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# CTEST_ARGS lets a user narrow a run: make test CTEST_ARGS='-R tokenize'
CTEST_ARGS ?=
PREFIX ?= /usr/local
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_JOBS ?= $(JOBS)
FUZZ_CC ?= clang-14
FUZZ_LIB := $(wildcard /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a)
# the one version number: CMakeLists.txt's project(VERSION); e2e.release checks every pin
VERSION := $(shell grep -m1 -o 'moe_genomics VERSION [0-9.]*' CMakeLists.txt | cut -d' ' -f3)
DIST_DIR ?= .

DEB_PACKAGES := build-essential cmake pkg-config ninja-build libhts-dev libyaml-dev zlib1g-dev libdeflate-dev \
	libjansson-dev libopenblas-dev libopenmpi-dev openmpi-bin python3 python3-numpy samtools tabix bcftools \
	bowtie2-examples htslib-test seqkit-examples snakemake help2man man-db debhelper

.PHONY: all build deps test test-asan fuzz demo bench install deb dist clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "make deps: all Debian packages present"; exit 0; fi; \
	echo "make deps: installing:$$missing"; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	$$sudo apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Developer builds: warnings are errors (users' and packagers' builds keep MOE_WERROR off).
# An existing build tree keeps its generator; a new one is Ninja. ctest starts the slowest tests
# first (COST in tests/CMakeLists.txt) and make fuzz runs a harness per core, so that a
# clean-clone make test stays under 10 minutes on 2 cores (figures: docs/reliability.md).
test: deps
	cmake -S . -B $(BUILD) $(if $(wildcard $(BUILD)/CMakeCache.txt),,-G Ninja) -DMOE_WERROR=ON $(CMAKE_FLAGS)
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)
	@if command -v $(FUZZ_CC) >/dev/null && [ -n "$(FUZZ_LIB)" ] && [ -z "$(CTEST_ARGS)" ]; then \
	  $(MAKE) fuzz; \
	else echo "make test: no $(FUZZ_CC) + libfuzzer-14-dev: the fuzz targets are not run"; fi

fuzz:
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_C_COMPILER=$(FUZZ_CC) -DMOE_CUDA=OFF \
	  -DMOE_SANITIZE=ON -DMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_fastx fuzz_shard fuzz_safetensors \
	  fuzz_config fuzz_ckpt fuzz_ckpt_dir fuzz_vcf fuzz_vcf_score
	FUZZ_JOBS=$(FUZZ_JOBS) tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

demo: deps
	$(MAKE) build
	MOE_BUILD_DIR=$(CURDIR)/$(BUILD) pipelines/quickstart.sh

test-asan: deps
	cmake -S . -B build-asan $(if $(wildcard build-asan/CMakeCache.txt),,-G Ninja) -DMOE_WERROR=ON \
	  -DMOE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	$(MAKE) build BUILD=build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE gpu $(CTEST_ARGS)

bench: deps
	$(MAKE) build
	bench/tokenize.sh $(BUILD)
	bench/train_cpu.sh $(BUILD)

install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

deb: deps
	dpkg-buildpackage -us -uc -b

dist:
	git archive --format=tar.gz --prefix=moe-genomics-$(VERSION)/ \
		-o $(DIST_DIR)/moe-genomics-$(VERSION).tar.gz HEAD
	sha256sum $(DIST_DIR)/moe-genomics-$(VERSION).tar.gz

clean:
	rm -rf build build-asan
