# ptrain -- make (all), make run, make test, make bench, make install, make clean
# gcc is the default compiler; `make CC=clang` works too.
CC = gcc
CXX = g++
MPICC = mpicc
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

EXAMPLES = train sample hello_layer quickstart tensor_parallel pipeline plan plan_1t sim_vs_real
BINS = $(addprefix build/,$(EXAMPLES)) build/fixture_check build/tests build/bench_step \
       build/bench_kernels build/bench_parallel build/bench_pipeline build/comm_check
# the same programs with ranks as MPI processes (-DPTRAIN_MPI, Open MPI's mpicc)
MPI_BINS = build/fixture_check_mpi build/train_mpi build/bench_parallel_mpi build/comm_check_mpi \
           build/plan_mpi
MPI_CC = OMPI_CC="$(CC)" MPICH_CC="$(CC)" $(MPICC)
# the communicator checks
COMM_SRC = tests/comm_check.c ptrain.h

.PHONY: all run test bench install clean deps deps-test deps-mpi

all: $(BINS) $(MPI_BINS)

deps:
	@CC="$(CC)" sh scripts/deps.sh run

deps-test:
	@CC="$(CC)" sh scripts/deps.sh test

deps-mpi:
	@CC="$(CC)" sh scripts/deps.sh mpi

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

# threads and self backends; the MPI one through mpicc (with $(CC) underneath)
build/comm_check: $(COMM_SRC) | build deps
	$(CC) $(CFLAGS) -pthread $< -o $@ $(LDLIBS)

build/comm_check_asan: $(COMM_SRC) | build deps
	$(CC) $(SANFLAGS) -pthread $< -o $@ $(LDLIBS)

build/comm_check_mpi: $(COMM_SRC) | build deps deps-mpi
	$(MPI_CC) $(CFLAGS) -pthread -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/comm_check_mpi_asan: $(COMM_SRC) | build deps deps-mpi
	$(MPI_CC) $(SANFLAGS) -pthread -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/fixture_check_mpi: tests/fixture_check.c $(HDR) | build deps deps-mpi
	$(MPI_CC) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/train_mpi: examples/train.c $(HDR) | build deps deps-mpi
	$(MPI_CC) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/plan_mpi: examples/plan.c $(HDR) | build deps deps-mpi
	$(MPI_CC) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/bench_parallel_mpi: bench/bench_parallel.c $(HDR) | build deps deps-mpi
	$(MPI_CC) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/bench_%: bench/bench_%.c $(HDR) | build deps
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# The main job: a small GPT on the embedded task, about two minutes on 2 cores.
run: build/train
	build/train --checkpoint build/train_ckpt.safetensors

test: deps-test
	@$(MAKE) --no-print-directory all build/tests_asan build/fixture_check_asan build/tests_noblas \
	    build/comm_check_asan build/comm_check_mpi_asan
	@CC="$(CC)" CXX="$(CXX)" BLAS="$(BLAS)" sh tests/run.sh

bench: build/bench_step build/bench_kernels build/bench_parallel build/bench_parallel_mpi \
       build/bench_pipeline build/sim_vs_real build/plan
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
