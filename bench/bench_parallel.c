/* bench_parallel: where the time of a tensor x data parallel run goes, per
   rank: computing, and inside the communicator (which includes waiting for
   the slowest rank, and, with more ranks than cores, for a core).

     build/bench_parallel --tp 2 --dp 2 [--config gpt2-124m] [--layers 2]
                          [--batch 8] [--seq 64] [--steps 3] [--zero 0] [--sp] [--cp N]
                          [--overlap on|off] [--bucket-mb X]
     mpirun -np 4 build/bench_parallel_mpi --tp 2 --dp 2 ...

   Two measurements, each the median of --steps after a checked warm-up:
   - block: one GPT-2 block (the preset's width and heads) forward and
     backward on this rank's heads and MLP columns, its two all-reduces each
     way over the tensor-parallel group (the dp group plays no part; with
     --sp an all-gather and a reduce-scatter each instead, on N/tp rows;
     with --cp on T/cp tokens, attention's key/value blocks passed round the
     cp ring);
   - step: forward, backward and AdamW of the whole model (--layers blocks)
     on this rank's share of the batch, with the gradient reduction over the
     data-parallel group (ZeRO stage --zero).
   One line per rank: milliseconds in all, of which inside the communicator,
   and the payload it moved. --memory instead prints the bytes per rank of the
   layout (built as a meta model: nothing allocated). The check: the loss at initialisation is near
   ln V, and one step on the batch lowers it. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

#include <math.h>

typedef struct opts {
    const char *config, *overlap;
    int layers, batch, seq, steps, tp, dp, zero, memory, sp, cp;
    float bucket_mb;
} opts;


/* Seconds spent inside the grid's communicators so far. */
static double comm_seconds(const pt_grid *g) {
    return g->tp_comm.seconds + g->dp_comm.seconds + g->pp_comm.seconds + g->cp_comm.seconds +
           g->dpcp_comm.seconds;
}
static double comm_bytes(const pt_grid *g) {
    return (double)(g->tp_comm.bytes + g->dp_comm.bytes + g->pp_comm.bytes + g->cp_comm.bytes +
                    g->dpcp_comm.bytes);
}

/* The block alone under context parallelism: cp's ring buffers for B x T
   tokens of this rank's heads (pt_block_cp), in one allocation returned
   (NULL: out of memory). */
static void *block_cp(pt_block_cp *cp, pt_comm *ring, const pt_gpt_config *cfg, int tp, int B,
                      int T) {
    size_t hd = (size_t)(cfg->n_embd / cfg->n_head), N = (size_t)B * T;
    size_t NH = (size_t)(cfg->n_head / tp), kvh = (size_t)(cfg->n_kv_head ? cfg->n_kv_head : cfg->n_head);
    size_t nkv = N * 2 * (kvh / (size_t)tp) * hd, total = 5 * nkv + N * NH * hd + (size_t)B * NH * T;
    float *f = (float *)malloc(total * sizeof(float) + 2 * (size_t)T * sizeof(int));
    memset(cp, 0, sizeof *cp);
    if (!f) return NULL;
    cp->comm = ring;
    cp->kv[0] = f, cp->kv[1] = f + nkv, cp->acc[0] = f + 2 * nkv, cp->acc[1] = f + 3 * nkv;
    cp->part = f + 4 * nkv, cp->po = f + 5 * nkv, cp->pl = cp->po + N * NH * hd;
    cp->pos = (int *)(f + total), cp->kpos = cp->pos + T;
    return f;
}

/* Prints the ranks' lines in rank order: every rank's four numbers are
   gathered (through the world) to all, and rank 0 prints. */
static pt_status report(pt_comm *world, const char *what, double ms, double comm_ms,
                        double mb) {
    float mine[3], *all = (float *)malloc(sizeof(float) * 3 * (size_t)world->size);
    pt_status st;
    int r;
    if (!all) return pt_comm_fail(world, PT_ERR_OOM);
    mine[0] = (float)ms, mine[1] = (float)comm_ms, mine[2] = (float)mb;
    st = pt_comm_all_gather(world, mine, all, 3);
    if (st == PT_OK && world->rank == 0)
        for (r = 0; r < world->size; r++)
            printf("  %-5s rank %d: %9.1f ms, communicating %8.1f ms (%4.1f%%), %8.2f MB moved\n",
                   what, r, all[3 * r], all[3 * r + 1], 100.0 * all[3 * r + 1] / all[3 * r],
                   all[3 * r + 2]);
    free(all);
    return st;
}

static pt_status rank_main(pt_comm *world, void *arg) {
    opts *o = (opts *)arg;
    pt_grid grid;
    pt_gpt gpt;
    pt_gpt_desc d;
    pt_gpt_config cfg;
    pt_adamw_config opt = pt_adamw_default();
    pt_step_desc sd;
    pt_step_result res;
    pt_rng rng;
    pt_arena block;  /* one block's gradients, activations and scratch */
    pt_block_params bg;
    pt_block_acts ba;
    pt_block_scratch bs;
    int Bl = o->batch / o->dp, N, Nb, Tb = o->seq / o->cp, i, s;
    pt_block_cp ring;
    void *ring_buf = NULL;
    int *inputs = NULL, *targets = NULL;
    double *t = NULL, *c = NULL, loss0, loss1, c0 = 0.0, bytes0 = 0.0;
    float *x = NULL, *dout = NULL, *dx = NULL;
    pt_status st;
    memset(&gpt, 0, sizeof gpt);
    memset(&block, 0, sizeof block);
    if ((st = pt_grid_init_cp(&grid, world, o->tp, o->cp, o->dp, 1)) != PT_OK) return st;
    pt_gpt_config_preset(o->config, &cfg);
    if (o->layers) cfg.n_layer = o->layers;
    if (cfg.block_size < o->seq) cfg.block_size = o->seq;
    memset(&d, 0, sizeof d);
    d.config = cfg;
    d.batch = Bl;
    d.seq = o->seq;
    d.grid = &grid;
    d.zero = o->zero;
    d.sequence_parallel = o->sp;
    d.context_parallel = o->cp;
    d.bucket_bytes = (size_t)((double)o->bucket_mb * 1048576.0);
    N = Bl * o->seq, Nb = Bl * Tb; /* a step's tokens (whole rows), the block's */
    d.meta = o->memory;
    if ((st = pt_gpt_init(&gpt, &d)) != PT_OK) goto out;
    if (o->memory) { /* per-rank bytes against the ZeRO paper's terms (fp32: 4 bytes) */
        double P = (double)gpt.num_params_full / o->tp, mib = 1048576.0;
        if (world->rank == 0)
            printf("  memory per rank, ZeRO %d: params %7.1f MiB, grads %7.1f MiB, AdamW %7.1f "
                   "MiB, activations %6.1f MiB | model/tp P = %.1fM: 4P = %.1f MiB, 4P/dp = %.1f "
                   "MiB, 8P/dp = %.1f MiB | scratch %.1f MiB, total %.1f MiB\n",
                   o->zero, gpt.mem.params / mib, gpt.mem.grads / mib, gpt.mem.optimizer / mib,
                   gpt.mem.activations / mib, P / 1e6, 4 * P / mib, 4 * P / o->dp / mib,
                   8 * P / o->dp / mib, gpt.mem.scratch / mib, gpt.mem.total / mib);
        goto out;
    }
    pt_gpt_init_weights(&gpt, 1);
    inputs = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    targets = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    t = (double *)malloc(sizeof(double) * (size_t)o->steps);
    c = (double *)malloc(sizeof(double) * (size_t)o->steps);
    x = (float *)malloc(sizeof(float) * (size_t)Nb * cfg.n_embd);
    dout = (float *)malloc(sizeof(float) * (size_t)Nb * cfg.n_embd);
    dx = (float *)malloc(sizeof(float) * (size_t)Nb * cfg.n_embd);
    if (o->cp > 1) ring_buf = block_cp(&ring, &grid.cp_comm, &cfg, o->tp, Bl, Tb);
    pt_arena_init_meta(&block); /* measured, then allocated once */
    pt_block_layout(&cfg, Bl, Tb, o->tp, o->sp, &block, NULL, &bg, &ba, &bs);
    if (!inputs || !targets || !t || !c || !x || !dout || !dx || (o->cp > 1 && !ring_buf) ||
        pt_arena_init(&block, block.used, NULL) != PT_OK) {
        st = pt_comm_fail(world, pt_error(PT_ERR_OOM, "out of memory"));
        goto out;
    }
    pt_block_layout(&cfg, Bl, Tb, o->tp, o->sp, &block, NULL, &bg, &ba, &bs);
    if (o->cp > 1) bs.cp = &ring; /* attention as a ring over the cp group */
    memset(&sd, 0, sizeof sd);
    sd.inputs = inputs + (size_t)grid.dp_rank * N, sd.targets = targets + (size_t)grid.dp_rank * N;
    sd.B = Bl, sd.T = o->seq, sd.adamw = &opt, sd.lr = 1e-3f;
    sd.overlap = strcmp(o->overlap, "off") == 0 ? PT_OVERLAP_OFF : PT_OVERLAP_ON;
    pt_rng_seed(&rng, 7); /* the same batch on every rank; each takes its rows */
    for (i = 0; i < o->batch * o->seq; i++) {
        inputs[i] = (int)(pt_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
        targets[i] = (int)(pt_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
    }
    for (i = 0; i < Nb * cfg.n_embd; i++) x[i] = pt_rng_normal(&rng, 0, 1), dout[i] = 1e-3f;

    /* the check, which is also the warm-up: two steps on the same batch */
    if ((st = pt_gpt_step(&gpt, &sd, &res)) != PT_OK) goto out;
    loss0 = res.loss;
    if ((st = pt_gpt_step(&gpt, &sd, &res)) != PT_OK) goto out;
    loss1 = res.loss;
    if (!(fabs(loss0 - log((double)cfg.vocab_size)) < 0.5) || !(loss1 < loss0)) {
        st = pt_comm_fail(world, pt_error(PT_ERR_RANGE, "result check failed: loss %.4f "
                                          "(ln V = %.4f), then %.4f", loss0,
                                          log((double)cfg.vocab_size), loss1));
        goto out;
    }

    /* one block, forward and backward, tensor-parallel */
    for (s = 0; s < o->steps; s++) {
        pt_comm *tp = o->tp > 1 ? &grid.tp_comm : NULL;
        if ((st = pt_comm_barrier(world)) != PT_OK) goto out;
        c0 = comm_seconds(&grid);
        bytes0 = comm_bytes(&grid);
        t[s] = pt_time_now();
        if ((st = pt_block_forward(&gpt.ctx, &cfg, Bl, Tb, &gpt.layers[0], x, &ba, &bs, tp)) !=
                PT_OK ||
            (st = pt_block_backward(&gpt.ctx, &cfg, Bl, Tb, &gpt.layers[0], &bg, x, &ba, dout, dx,
                                    &bs, tp)) != PT_OK)
            goto out;
        t[s] = (pt_time_now() - t[s]) * 1e3;
        c[s] = (comm_seconds(&grid) - c0) * 1e3;
    }
    if ((st = report(world, "block", cli_median(t, o->steps), cli_median(c, o->steps),
                     (comm_bytes(&grid) - bytes0) / 1e6)) != PT_OK)
        goto out;

    /* whole steps */
    for (s = 0; s < o->steps; s++) {
        if ((st = pt_comm_barrier(world)) != PT_OK) goto out;
        c0 = comm_seconds(&grid);
        bytes0 = comm_bytes(&grid);
        t[s] = pt_time_now();
        if ((st = pt_gpt_step(&gpt, &sd, NULL)) != PT_OK) goto out;
        t[s] = (pt_time_now() - t[s]) * 1e3;
        c[s] = (comm_seconds(&grid) - c0) * 1e3;
    }
    st = report(world, "step", cli_median(t, o->steps), cli_median(c, o->steps),
                (comm_bytes(&grid) - bytes0) / 1e6);
out:
    if (st != PT_OK && st != PT_ERR_COMM) st = pt_comm_fail(world, st);
    free(inputs), free(targets), free(t), free(c), free(x), free(dout), free(dx), free(ring_buf);
    pt_arena_free(&block);
    pt_gpt_free(&gpt);
    pt_grid_free(&grid);
    return st;
}

int main(int argc, char **argv) {
    opts o;
    int npos, s, rc = 2;
    char cpname[32] = "";
    const char *pos[1];
    cli_opt table[] = {
        {"config", CLI_STR, &o.config, "model preset whose width and heads to use", 0, 0},
        {"layers", CLI_INT, &o.layers, "blocks in the whole-step model (0: the preset's)", 0,
         4096},
        {"batch", CLI_INT, &o.batch, "sequences per step over all dp ranks", 1, 1 << 16},
        {"seq", CLI_INT, &o.seq, "T", 1, 1 << 20},
        {"steps", CLI_INT, &o.steps, "timed repetitions of each measurement", 1, 1000},
        {"tp", CLI_INT, &o.tp, "tensor-parallel ranks", 1, 1024},
        {"sp", CLI_FLAG, &o.sp, "sequence parallelism over the tp ranks (the block's x, dout "
         "and dx are this rank's rows)", 0, 0},
        {"cp", CLI_INT, &o.cp, "context-parallel ranks (ring attention; 2cp divides --seq)", 1,
         1024},
        {"dp", CLI_INT, &o.dp, "data-parallel ranks", 1, 1024},
        {"zero", CLI_INT, &o.zero, "ZeRO stage", 0, 3},
        {"overlap", CLI_STR, &o.overlap, "on | off: the dp communication behind compute or after "
         "it", 0, 0},
        {"bucket-mb", CLI_FLOAT, &o.bucket_mb, "dp gradient buckets of at least this many MiB "
         "(default: a layer each)", 0, 0},
        {"memory", CLI_FLAG, &o.memory, "only print the per-rank memory (nothing allocated)", 0,
         0},
    };
    int nopts = (int)(sizeof table / sizeof table[0]);
    pt_gpt_config cfg;
    pt_status st;
    pt_comm world;
    if (!cli_world_begin(&world, &argc, &argv)) return 2;
    memset(&o, 0, sizeof o);
    o.config = "gpt2-124m", o.layers = 2, o.batch = 8, o.seq = 64, o.steps = 3;
    o.tp = 1, o.dp = 1, o.cp = 1, o.overlap = "on";
    if ((s = cli_parse(argc, argv, table, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: bench_parallel [options]", table, nopts);
        rc = s == 1 ? 0 : 2;
        goto done;
    }
    if (pt_gpt_config_preset(o.config, &cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto done;
    }
    if (strcmp(o.overlap, "on") != 0 && strcmp(o.overlap, "off") != 0) {
        fprintf(stderr, "error: --overlap '%s' is not on or off\n", o.overlap);
        goto done;
    }
    if (cli_given(argc, argv, "bucket-mb") && !(o.bucket_mb > 0.0f)) {
        fprintf(stderr, "error: --bucket-mb %g must be more than 0\n", (double)o.bucket_mb);
        goto done;
    }
    if (o.batch % o.dp || cfg.n_head % o.tp) {
        fprintf(stderr, "error: dp=%d must divide --batch %d and tp=%d must divide n_head=%d\n",
                o.dp, o.batch, o.tp, cfg.n_head);
        goto done;
    }
    if (o.cp > 1) snprintf(cpname, sizeof cpname, "cp %d x ", o.cp);
    if (o.cp > 1 && o.seq % (2 * o.cp)) {
        fprintf(stderr, "error: context_parallel=%d: --seq %d is not a multiple of 2*cp=%d\n",
                o.cp, o.seq, 2 * o.cp);
        goto done;
    }
    if (world.rank == 0)
        printf("%s, %d layers, B=%d T=%d, tp %d x %sdp %d, ZeRO %d, overlap %s, %s ranks\n",
               o.config, o.layers ? o.layers : cfg.n_layer, o.batch, o.seq, o.tp, cpname, o.dp,
               o.zero, o.overlap,
               world.kind == PT_COMM_MPI ? "MPI" : "thread");
    st = cli_world_run(&world, o.tp * o.cp * o.dp, rank_main, &o);
    if (st != PT_OK) fprintf(stderr, "error: %s\n", pt_last_error());
    rc = st == PT_OK ? 0 : 1;
done:
    cli_world_end(&world);
    return rc;
}
