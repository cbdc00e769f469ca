# ptrain -- make (all), make run, make test, make bench, make install, make clean
# gcc is the default compiler; `make CC=clang` works too.
CC = gcc
CXX = g++
PREFIX = /usr/local
ARCH = -march=native
MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS_INC = /usr/include/$(MULTIARCH)/openblas-openmp
BLAS_LIB = /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS = -I$(BLAS_INC) -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas
WARN = -Wall -Wextra -Wpedantic
# symbols and frame pointers everywhere, so `perf record -g` works on any binary
CFLAGS = -std=c11 -O2 $(ARCH) -g -fno-omit-frame-pointer $(WARN) -fopenmp
SANFLAGS = -std=c11 -O1 -g -fno-omit-frame-pointer $(WARN) -fopenmp \
           -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDLIBS = $(BLAS) -lm
HDR = ptrain.h examples/cli.h

EXAMPLES = train sample hello_layer quickstart
BINS = $(addprefix build/,$(EXAMPLES)) build/fixture_check build/tests build/bench_step \
       build/bench_kernels

.PHONY: all run test bench install clean deps deps-test

all: $(BINS)

deps:
	@CC="$(CC)" sh scripts/deps.sh run

deps-test:
	@CC="$(CC)" sh scripts/deps.sh test

build:
	@mkdir -p build

build/%: examples/%.c $(HDR) | build deps
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/fixture_check: tests/fixture_check.c $(HDR) | build deps
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/tests: tests/test_main.c ptrain.h | build deps
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/tests_asan: tests/test_main.c ptrain.h | build deps
	$(CC) $(SANFLAGS) $< -o $@ $(LDLIBS)

build/fixture_check_asan: tests/fixture_check.c $(HDR) | build deps
	$(CC) $(SANFLAGS) $< -o $@ $(LDLIBS)

build/tests_noblas: tests/test_main.c ptrain.h | build deps
	$(CC) $(CFLAGS) -DPTRAIN_NO_BLAS $< -o $@ -lm

build/bench_%: bench/bench_%.c $(HDR) | build deps
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# The main job: a small GPT on the embedded task, about two minutes on 2 cores.
run: build/train
	build/train --checkpoint build/train_ckpt.safetensors

test: deps-test
	@$(MAKE) --no-print-directory all build/tests_asan build/fixture_check_asan build/tests_noblas
	@CC="$(CC)" CXX="$(CXX)" BLAS="$(BLAS)" sh tests/run.sh

bench: build/bench_step build/bench_kernels
	@sh bench/run.sh

install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 644 ptrain.h $(DESTDIR)$(PREFIX)/include/ptrain.h

clean:
	rm -rf build

# ptrain against PyTorch float32 on the same training steps (bench/compare.sh);
# installs Debian's python3-torch first if /usr/bin/python3 lacks torch.
.PHONY: bench-torch
bench-torch:
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || { \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "ptrain: installing python3-torch"; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	        $$SUDO apt-get install -y -qq --no-install-recommends python3-torch || \
	    { echo "ptrain: installing failed; run: sudo apt-get install python3-torch"; exit 1; }; }
	@$(MAKE) --no-print-directory build/bench_step
	@sh bench/compare.sh
