# Front door: `make demo` runs the main job, `make test` runs the tests. Both install the
# Debian packages first (tools/install-deps.sh does nothing when they are present).
BUILD    ?= build
SANITIZE ?= OFF
JOBS     ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test test-emu test-emu-tsan demo asan format format-check fuzz clean

all: build

deps:
	@bash tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DKVFS_SANITIZE=$(SANITIZE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash tools/demo.sh $(BUILD)

.PHONY: demo-stop
demo-stop:
	@bash tools/demo.sh stop $(BUILD)

asan:
	$(MAKE) test BUILD=build-asan SANITIZE=ON

# The GPU tests on the CUDA emulation (tests/cuda-emu, docs/cuda-emu.md): the CUDA sources run on
# the CPU, under ASan + UBSan unless EMU_SANITIZE=OFF. Only the targets those tests need.
EMU_BUILD    ?= build-emu
EMU_SANITIZE ?= ON
test-emu: deps
	@cmake -S . -B $(EMU_BUILD) -DKVFS_CUDA=EMU -DKVFS_SANITIZE=$(EMU_SANITIZE) >/dev/null
	@cmake --build $(EMU_BUILD) -j $(JOBS) --target emu-tests
	cd $(EMU_BUILD) && ctest -L emu --output-on-failure -j $(JOBS)

# The same, built with ThreadSanitizer, which then also sees data races between CUDA threads
# (docs/cuda-emu.md, "Races"): the emulator's self-test, the kernel and device-engine tests on
# their short shape lists (the _jitter variants: under TSan the full lists take too long), the
# device vision tower, the NCCL transfer, and the serving path over NCCL (its workers and
# gateway built with TSan too).
EMU_TSAN_BUILD ?= build-emu-tsan
EMU_TSAN_TESTS ?= ^emu_test_(kvk_emu|kernels_nccl|kernels_cuda_jitter|fwd_dev_cuda_jitter|vit_cuda|handoff_nccl)$$
test-emu-tsan: deps
	@cmake -S . -B $(EMU_TSAN_BUILD) -DKVFS_CUDA=EMU -DKVFS_TSAN=ON >/dev/null
	@cmake --build $(EMU_TSAN_BUILD) -j $(JOBS) --target emu-tests
	cd $(EMU_TSAN_BUILD) && ctest -L emu -R '$(EMU_TSAN_TESTS)' --output-on-failure -j $(JOBS)

FORMAT_FILES = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cc')
format:
	clang-format -i $(FORMAT_FILES)

format-check:
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "clang-format: clean"

# libFuzzer targets, each run for FUZZ_SECONDS (bounded, for CI).
FUZZ_SECONDS ?= 20
fuzz: deps
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKVFS_FUZZ=ON -DKVFS_CUDA=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@bash tools/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-fuzz build-emu build-emu-tsan build-release
