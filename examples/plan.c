/* plan.c -- plan a training run on a modeled cluster: memory per GPU, step
   time, throughput, bubble, communication; or search for the best layout.

   build/plan --preset gpt-1t                          Megatron-LM's 1T on 3072 A100s
   build/plan --layers 24 --hidden 2304 --heads 24 --seq 2048 --vocab 51200 \
              --tp 1 --pp 1 --gpus 32 --batch 512 --microbatch 16 --recompute full \
              --hw a100-80g --json
   build/plan --preset gpt-175b --hw mi250x --gpus 1024 --batch 640 --search
   build/plan --preset gpt-1t --trace build/1t.json    the step as Chrome trace + SVG
   build/plan --calibrate                              measure this machine (--hw local)
   mpirun -n 2 build/plan_mpi --calibrate              the same with MPI's messages
                                                       (build/hw-local-mpi.txt)

   The simulator builds every rank's model in a meta arena (sizes, no memory)
   and runs the same pipeline schedules the real executor runs, with each
   action's time from the profile's cost model. Data parallelism is
   gpus / (tp x pp). Exit status: 0, 1 when the plan is impossible (does not
   divide, out of memory), 2 for bad options. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv, sysconf */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/plan_opts.h"


/* --hw NAME: a preset, or "local" from the calibration file (measured first
   at --precision when there is none; one at another precision is refused). */
static int load_hw(const char *name, const char *file, pt_precision prec, pt_hw *hw) {
    if (strcmp(name, "local") != 0) return pt_hw_preset(name, hw) == PT_OK;
    if (pt_hw_load(file, hw) == PT_OK) {
        if (prec == PT_PRECISION_DEFAULT ||
            (hw->precision == PT_PRECISION_BF16) == (prec == PT_PRECISION_BF16))
            return 1;
        pt_error(PT_ERR_CONFIG, "%s was measured at %s, not --precision %s: name another "
                 "--hw-file (calibrated when missing)", file, pt_precision_name(hw->precision),
                 pt_precision_name(prec));
        return 0;
    }
    if (access(file, F_OK) == 0) return 0; /* there, but broken: say so */
    fprintf(stderr, "plan: no profile of this machine in %s (%s); calibrating (a few s)\n",
            file, pt_last_error());
    if (pt_hw_calibrate(hw, NULL, prec) != PT_OK) return 0;
    if (pt_hw_save(hw, file) != PT_OK)
        fprintf(stderr, "plan: could not save the profile: %s\n", pt_last_error());
    return 1;
}

static const char *rc_name(int rc) {
    return rc == PT_RECOMPUTE_FULL ? "full" : rc == PT_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static void print_json(const pt_plan_desc *d, const pt_hw *hw, const pt_plan_result *r,
                       int stages) {
    const pt_gpt_desc *md = &d->model;
    int i;
    printf("{\"hw\": \"%s\", \"layers\": %d, \"hidden\": %d, \"heads\": %d, \"seq\": %d, "
           "\"vocab\": %d, \"tp\": %d, \"pp\": %d, \"cp\": %d, \"dp\": %d, \"gpus\": %d, "
           "\"batch\": %d, "
           "\"microbatch\": %d, \"chunks\": %d, \"schedule\": \"%s\", \"zero\": %d, "
           "\"recompute\": \"%s\", \"micro_batches\": %d, \"pp_split\": \"%s\",\n",
           hw->name, md->config.n_layer, md->config.n_embd, md->config.n_head, md->seq,
           md->config.vocab_size, d->tp, d->pp, d->cp > 1 ? d->cp : 1, r->dp, d->gpus, d->batch,
           md->batch, r->chunks,
           pt_schedule_kind_name(r->schedule), md->zero, rc_name(md->recompute),
           r->micro_batches, r->pp_split == PT_SPLIT_EMBED_LOSS ? "embedding-loss" : "even");
    printf(" \"tflops_per_gpu\": %.2f, \"model_tflops_per_gpu\": %.2f, \"percent_of_peak\": %.2f, "
           "\"step_time_s\": %.6g, \"bubble_fraction\": %.4f, \"comm_exposed_s\": %.6g,\n",
           r->tflops_per_gpu, r->model_tflops_per_gpu, r->percent_of_peak, r->step_time,
           r->bubble_fraction, r->comm_exposed);
    printf(" \"compute_s\": %.6g, \"tp_comm_s\": %.6g, \"pp_comm_s\": %.6g, \"dp_comm_s\": %.6g, "
           "\"dp_hidden_s\": %.6g, \"optimizer_s\": %.6g, \"tokens_per_s\": %.6g, "
           "\"train_seconds\": %.6g,\n",
           r->compute_s, r->tp_comm_s, r->pp_comm_s, r->dp_comm_s, r->dp_hidden_s, r->optimizer_s,
           r->tokens_per_s, r->train_seconds);
    printf(" \"memory_per_gpu_bytes\": %.0f, \"memory_rank\": %d, \"memory\": {\"params\": %.0f, "
           "\"grads\": %.0f, \"optimizer\": %.0f, \"activations\": %.0f}, "
           "\"device_memory_bytes\": %.0f, \"fits\": %s, \"build_seconds\": %.3f",
           r->mem.total, r->mem_rank, r->mem.params, r->mem.grads, r->mem.optimizer,
           r->mem.activations, hw->mem_bytes, r->fits ? "true" : "false", r->build_seconds);
    for (i = 0; stages && i < d->pp; i++) { /* every pipeline stage's ranks alike */
        const pt_plan_stage *g = &r->stage[i];
        printf("%s{\"stage\": %d, \"layers\": %d, \"memory_bytes\": %.0f, \"busy_s\": %.6g, "
               "\"hw_flops\": %.6g, \"tp_bytes\": %.6g, \"pp_bytes\": %.6g, \"dp_bytes\": %.6g}",
               i ? ",\n  " : ",\n \"stages\": [", i, g->layers, g->mem.total, g->busy_s,
               g->hw_flops, g->tp_bytes, g->pp_bytes, g->dp_bytes);
    }
    printf("%s}", stages ? "]" : "");
}

/* Every pipeline stage: what each of its tp x cp x dp ranks holds, does and sends. */
static void print_stages(const pt_plan_desc *d, const pt_plan_result *r) {
    const double G = 1073741824.0;
    int st, n = d->tp * (d->cp > 1 ? d->cp : 1) * r->dp; /* ranks a stage */
    printf("stage  ranks          layers  memory GiB  busy s   TFLOP   tp GB   pp GB   dp GB\n");
    for (st = 0; st < d->pp; st++) {
        const pt_plan_stage *g = &r->stage[st];
        int first = st * n;
        printf("%5d  %6d..%-6d  %6d  %10.2f  %6.2f  %6.1f  %6.2f  %6.2f  %6.2f\n", st, first,
               first + n - 1, g->layers, g->mem.total / G, g->busy_s,
               g->hw_flops / 1e12, g->tp_bytes / 1e9, g->pp_bytes / 1e9, g->dp_bytes / 1e9);
    }
}

/* FLOP/s (or parameters) with the unit that fits: "163.2 T", "83.1 G", "1.2 M" */
static const char *si(double x, char *buf) {
    const char *u = x >= 1e12 ? "T" : x >= 1e9 ? "G" : x >= 1e6 ? "M" : "";
    double d = x >= 1e12 ? 1e12 : x >= 1e9 ? 1e9 : x >= 1e6 ? 1e6 : 1;
    snprintf(buf, 32, u[0] ? "%.1f %s" : "%.1f", x / d, u);
    return buf;
}

static void print_human(const pt_plan_desc *d, const pt_hw *hw, const pt_plan_result *r) {
    const double G = 1073741824.0;
    char b1[32], b2[32], b3[32];
    const pt_gpt_desc *md = &d->model;
    pt_gpt_config cfg = md->config; /* as the simulator builds it: block_size the sequence */
    double params;
    cfg.block_size = md->seq;
    params = (double)pt_gpt_num_params(&cfg);
    printf("model   %s parameters: %d layers, hidden %d, %d heads, sequence %d, vocabulary %d\n",
           params >= 1e9 ? (snprintf(b1, 32, "%.1fB", params / 1e9), b1)
                          : (snprintf(b1, 32, "%.1fM", params / 1e6), b1),
           cfg.n_layer, cfg.n_embd, cfg.n_head, md->seq, cfg.vocab_size);
    snprintf(b2, sizeof b2, "cp %d x ", d->cp); /* (shown with context parallelism) */
    printf("layout  %d x %s: tp %d x pp %d x %sdp %d; batch %d = %d micro-batches of %d a "
           "pipeline; %s (%d chunk%s a stage), ZeRO %d, recompute %s\n",
           d->gpus, hw->name, d->tp, d->pp, d->cp > 1 ? b2 : "", r->dp, d->batch, r->micro_batches, md->batch,
           pt_schedule_kind_name(r->schedule), r->chunks, r->chunks > 1 ? "s" : "", md->zero,
           rc_name(md->recompute));
    if (r->schedule == PT_SCHED_2BW)
        printf("note    2bw is asynchronous: %d weight updates a step, each from the gradient "
               "of %d micro-batches at the weights one update older (two versions held)\n",
               r->micro_batches / d->pp, d->pp);
    printf("step    %.3f s: %sFLOP/s per GPU (%.1f%% of %sFLOP/s peak), model %sFLOP/s; "
           "%.0f tokens/s (%.0f per GPU)\n",
           r->step_time, si(r->tflops_per_gpu * 1e12, b1), r->percent_of_peak,
           si(hw->peak_flops, b2), si(r->model_tflops_per_gpu * 1e12, b3), r->tokens_per_s,
           r->tokens_per_s / d->gpus);
    if (hw->instr_flops > 0 && d->gpus <= hw->per_node) /* a local profile: MFU of the machine */
        printf("MFU     %.1f%% of this machine's %s instruction peak (%sFLOP/s, all its cores)\n",
               100.0 * r->model_tflops_per_gpu * 1e12 * d->gpus / hw->instr_flops,
               pt_precision_name(hw->precision),
               si(hw->instr_flops, b1));
    else if (hw->exec == PT_EXEC_PTRAIN && d->gpus <= hw->per_node) /* probed, none found */
        printf("MFU     none: the profile has no instruction peak (no FMA on this CPU, or "
               "not an x86-64 build)\n");
    printf("time    busiest rank: compute %.3f s, tp comm %.3f s, pp comm %.3f s, dp comm %.3f s, "
           "optimizer %.3f s; bubble %.1f%%\n",
           r->compute_s, r->tp_comm_s, r->pp_comm_s, r->dp_comm_s, r->optimizer_s,
           100.0 * r->bubble_fraction);
    if (r->dp_buckets > 0)
        printf("dp      %d gradient bucket%s: %.3f s of communication behind compute, %.3f s "
               "waited for\n", r->dp_buckets, r->dp_buckets > 1 ? "s" : "", r->dp_hidden_s,
               r->dp_comm_s);
    printf("memory  rank %d: %.2f GiB of %.0f GiB (weights %.2f, gradients %.2f, optimizer %.2f, "
           "activations %.2f)\n",
           r->mem_rank, r->mem.total / G, hw->mem_bytes / G, r->mem.params / G, r->mem.grads / G,
           r->mem.optimizer / G, r->mem.activations / G);
    if (r->train_seconds > 0)
        printf("train   %.3g tokens in %.1f days\n", d->train_tokens, r->train_seconds / 86400.0);
    printf("built   %d ranks' meta models in %.3f s\n", d->gpus, r->build_seconds);
}

/* One search result's line, and what it gives up against the best. */
static void print_row(int i, const pt_plan_desc *d, const pt_plan_result *r) {
    /* 2bw* : asynchronous (batch t computed at the weights before t - 1's update) */
    /* cp and the pipeline's split only where they are not the plain ones; e: the embedding
       and the loss counted as a layer each (--pp-split embedding-loss) */
    char name[16], cpx[16] = "", ex[4] = "";
    snprintf(name, sizeof name, "%s%s", pt_schedule_kind_name(r->schedule),
             r->schedule == PT_SCHED_2BW ? "*" : "");
    if (d->cp > 1) snprintf(cpx, sizeof cpx, " cp %d", d->cp);
    if (r->pp_split == PT_SPLIT_EMBED_LOSS) snprintf(ex, sizeof ex, "e");
    printf("%2d  tp %-2d pp %-3d dp %-4d v %d%-1s mb %-2d%s  %-11s ZeRO %d  %-9s  %7.1f  %5.1f%%"
           "  %6.3f s  %4.1f%%  %5.1f%%  %6.1f GiB\n",
           i, d->tp, d->pp, r->dp, r->chunks, ex, d->model.batch, cpx, name, d->model.zero,
           rc_name(d->model.recompute), r->tflops_per_gpu, r->percent_of_peak, r->step_time,
           100.0 * r->bubble_fraction, 100.0 * r->comm_exposed / r->step_time,
           r->mem.total / 1073741824.0);
}

/* A time difference as the explanations print it: "+14.2 ms", "-1.25 s". */
static const char *dt(double s, char *buf) {
    if (fabs(s) >= 1.0) snprintf(buf, 32, "%+.2f s", s);
    else snprintf(buf, 32, "%+.1f ms", s * 1e3);
    return buf;
}

/* A step in the parts the search's table shows (seconds, summing to the
   step): [4] the bubble (its bubble column x step), [2] the communication
   not behind compute (its comm column x step), [3] the optimizer, [1]
   recomputation (the compute's share of hardware FLOPs the model does not
   count), [0] compute: the rest. */
static void step_parts(const pt_plan_result *r, double p[5]) {
    double rc = r->hw_flops > 0 ? (r->hw_flops - r->model_flops) / r->hw_flops : 0.0;
    p[4] = r->bubble_fraction * r->step_time, p[2] = r->comm_exposed, p[3] = r->optimizer_s;
    p[1] = r->compute_s * rc, p[0] = r->step_time - p[1] - p[2] - p[3] - p[4];
}

/* Why search result #i (b) is slower than #1 (a), from the figures that
   differ: the step's difference ("ties with #1" when the steps are the same
   within 1e-9), then each part that differs by 0.05 ms or more, the largest
   increase first. */
static void print_loss(int i, const pt_plan_result *a, const pt_plan_result *b) {
    static const char *name[5] = {"compute", "recomputation", "communication", "optimizer",
                                  "bubble"};
    double pa[5], pb[5], d[5];
    int k, j, order[5], shown = 0, tie = fabs(b->step_time - a->step_time) <= 1e-9 * a->step_time;
    char buf[32];
    step_parts(a, pa), step_parts(b, pb);
    for (k = 0; k < 5; k++) { /* by d, largest first */
        d[k] = pb[k] - pa[k];
        for (j = k; j > 0 && d[order[j - 1]] < d[k]; j--) order[j] = order[j - 1];
        order[j] = k;
    }
    printf("\n #%-2d %s", i, tie ? "ties with #1" : dt(b->step_time - a->step_time, buf));
    for (j = 0; j < 5; j++)
        if (fabs(d[order[j]]) >= 0.5e-4)
            printf("%s %s %s", shown++ ? "," : ":", name[order[j]], dt(d[order[j]], buf));
    if (!shown && !tie) printf(": no part by 0.05 ms or more");
}

int main(int argc, char **argv) {
    plan_args pa;
    pt_plan_desc d;
    pt_plan_result r;
    pt_hw hw;
    const char *hw_file, *trace_path;
    int json, search, stages, top, s, i;

    cli_passive_wait(argv);
    if ((s = plan_options(argc, argv, &pa, 1)) >= 0) return s;
    d = pa.d, hw_file = pa.hw_file, trace_path = pa.trace_path;
    json = pa.json, search = pa.search, stages = pa.stages, top = pa.top;
    if (pa.calibrate) { /* under MPI (build/plan_mpi on mpirun) the messages are MPI's */
        pt_comm world;
        int mpi;
        if (!cli_world_begin(&world, &argc, &argv)) return 1;
        mpi = world.size > 1;
        if (mpi && hw_file == hw_file_default) hw_file = "build/hw-local-mpi.txt";
        if (pt_hw_calibrate(&hw, mpi ? &world : NULL, pa.precision) != PT_OK ||
            (world.rank == 0 && pt_hw_save(&hw, hw_file) != PT_OK)) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            cli_world_end(&world);
            return 1;
        }
        s = world.rank;
        cli_world_end(&world);
        if (s != 0) return 0;
        if (hw.instr_flops > 0)
            printf("this machine: %s instruction peak %.1f GFLOP/s (%s), ",
                   pt_precision_name(hw.precision), hw.instr_flops / 1e9,
                   hw.precision != PT_PRECISION_BF16          ? "FMA"
                   : strncmp(pt_gemm_bf16_name(), "ptrain", 6) ? "FMA: bf16 runs on the fp32 GEMM here"
                                                              : "bf16 dot products");
        else
            printf("this machine: %s instruction peak none (no FMA on this CPU, or not an "
                   "x86-64 build), ", pt_precision_name(hw.precision));
        printf("GEMM %.1f GFLOP/s "
               "(2048^3; tiling halves a dimension of %.0f), "
               "memory %.1f GB/s, attention %.1f GFLOP/s, %s all-reduce %.1f us + %.2f GB/s; "
               "%d cores -> %s\n",
               hw.peak_flops / 1e9, hw.gemm_dim, hw.mem_bw / 1e9,
               hw.attn_flops / 1e9,
               strcmp(hw.name, "local-mpi") == 0 ? "MPI" : "threads", hw.intra_lat * 1e6,
               hw.intra_bw / 1e9, hw.cores, hw_file);
        if (hw.core_flops > 0)
            printf("one thread:   GEMM %.1f GFLOP/s, memory %.1f GB/s, attention %.1f GFLOP/s, "
                   "a small kernel %.1f us\n", hw.core_flops / 1e9, hw.core_mem_bw / 1e9,
                   hw.core_attn_flops / 1e9, hw.core_kernel_s * 1e6);
        return 0;
    }
    if (!load_hw(pa.hw_name ? pa.hw_name : "a100-80g", hw_file, pa.precision, &hw)) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    if (pa.inter_gbps > 0) hw.inter_bw = pa.inter_gbps * 1e9 / 8.0;

    if (search) {
        pt_plan_desc best_d[100];
        pt_plan_result best[100];
        int why[3], n = pt_plan_search(&d, &hw, best_d, best, top, why);
        if (json && n > 0) { /* the best layouts, best first, as a JSON array */
            printf("[");
            for (i = 0; i < n && i < top; i++) {
                printf(i ? ",\n" : "\n");
                print_json(&best_d[i], &hw, &best[i], 0);
            }
            printf("]\n");
            return 0;
        }
        printf("search: %d layers, hidden %d, %d heads on %d x %s, batch %d, sequence %d\n",
               d.model.config.n_layer, d.model.config.n_embd, d.model.config.n_head, d.gpus,
               hw.name, d.batch, d.model.seq);
        if (n == 0) {
            fprintf(stderr, "error: no layout fits: %d do not divide, %d out of memory (%s)\n",
                    why[0], why[1], pt_last_error());
            return 1;
        }
        printf(" #  layout                          schedule    ZeRO  recompute  TFLOP/s  "
               "%%peak   step     bubble comm   memory\n");
        for (i = 0; i < n && i < top; i++) print_row(i + 1, &best_d[i], &best[i]);
        for (i = 0; i < n && i < top; i++)
            if (best[i].schedule == PT_SCHED_2BW) {
                printf("2bw* is asynchronous (PipeDream-2BW): each batch's gradient comes from the "
                       "weights one update older, so it trains by another rule than the others\n");
                break;
            }
        printf("%d layouts fit; the others lose: %d do not divide the model or batch, %d run out "
               "of memory, %d are slower", n, why[0], why[1], why[2]);
        if (n > 1 && top > 1) printf("; against #1, the parts of the step that differ:");
        for (i = 1; i < n && i < top; i++) print_loss(i + 1, &best[0], &best[i]);
        printf("\n");
        return 0;
    }

    {
        pt_trace trace;
        pt_status st;
        memset(&trace, 0, sizeof trace);
        trace.title = "ptrain simulated step";
        trace.track_name = "stage";
        st = pt_plan_simulate(&d, &hw, &r, trace_path ? &trace : NULL);
        if (st != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            pt_trace_free(&trace);
            return 1;
        }
        if (json) print_json(&d, &hw, &r, stages), printf("\n");
        else print_human(&d, &hw, &r);
        if (stages && !json) print_stages(&d, &r);
        if (trace_path) {
            char svg[1024];
            size_t len = strlen(trace_path);
            snprintf(svg, sizeof svg, "%.*s.svg",
                     (int)(len > 5 && strcmp(trace_path + len - 5, ".json") == 0 ? len - 5 : len),
                     trace_path);
            if (pt_trace_write_chrome(&trace, trace_path) != PT_OK ||
                pt_trace_write_svg(&trace, svg) != PT_OK) {
                fprintf(stderr, "error: %s\n", pt_last_error());
                pt_trace_free(&trace);
                return 1;
            }
            if (!json) printf("trace   %s and %s\n", trace_path, svg);
        }
        pt_trace_free(&trace);
    }
    return 0;
}
