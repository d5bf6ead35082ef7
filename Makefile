# moetrain — top-level entry points. The real build is CMake (build/ and build-asan/).
#   make          build the release binary build/moetrain
#   make demo     install packages, build, make the math corpus, train the demo model, evaluate
#   make check    install packages, build release + sanitizer builds, run the whole test suite
JOBS ?= $(shell nproc)
BUILD ?= build
DEMO_DIR ?= demo_out

.PHONY: all deps deps-test build build-asan demo check clean bench

all: build

deps:
	@scripts/deps.sh

deps-test:
	@scripts/deps.sh --with-torch

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMT_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)/moetrain $(DEMO_DIR)

check: deps-test build build-asan
	@echo "== release build: full suite"
	@cd $(BUILD) && ctest --output-on-failure -j 2
	@echo "== sanitizer build (ASan+UBSan): unit tests and a training smoke test"
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -L 'unit|sanitize'

bench: build
	@bench/bench_small.sh $(BUILD)/moetrain

clean:
	rm -rf build build-asan
