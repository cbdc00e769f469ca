/* plan_opts.h -- build/plan's command line: the published configurations
   it knows by name, the option table and its checks. examples/plan.c runs
   what it describes; fuzz/plan_cli.c fuzzes it. Include after ptrain.h and
   cli.h. */
#ifndef PTRAIN_PLAN_OPTS_H
#define PTRAIN_PLAN_OPTS_H

/* Published configurations. The Megatron-LM rows are Narayanan et al. 2021,
   Table 1 (A100 80GB, sequence 2048, vocabulary 51200, full recomputation)
   where the paper gives the micro-batch; gpt-22b/175b/1t are the three model
   sizes of the Frontier study (Dash et al. 2023), with Megatron-LM's layout
   for the 1T. */
typedef struct plan_preset {
    const char *name;
    int layers, hidden, heads, tp, pp, gpus, batch, micro, chunks;
    const char *hw;
    double published; /* TFLOP/s per GPU the paper reports (0: none) */
    int zero;
    const char *model; /* a pt_gpt_config_preset whose block and sizes (layers, hidden,
                          heads, sequence, vocabulary) the plan takes; NULL: GPT-2's block */
    int seq;           /* the run's sequence when not the model's (0: the model's) */
    const char *recompute; /* NULL: full */
    const char *overlap;   /* NULL: the executor's default */
    double bucket_mb;      /* gradient buckets, MiB of fp32 (0: a layer each) */
    double inter_gbps;     /* a device's network Gbit/s across nodes (0: the profile's) */
} plan_preset;

static const plan_preset presets[] = {
    {"megatron-1.7b", 24, 2304, 24, 1, 1, 32, 512, 16, 1, "a100-80g", 137, 0, NULL, 0, NULL, NULL, 0, 0},
    {"megatron-145.6b", 80, 12288, 96, 8, 8, 1536, 2304, 2, 2, "a100-80g", 148, 0, NULL, 0, NULL, NULL, 0, 0},
    {"megatron-1t", 128, 25600, 160, 8, 64, 3072, 3072, 1, 1, "a100-80g", 163, 0, NULL, 0, NULL, NULL, 0, 0},
    {"gpt-22b", 48, 6144, 48, 8, 1, 64, 512, 1, 1, "a100-80g", 0, 0, NULL, 0, NULL, NULL, 0, 0},
    {"gpt-175b", 96, 12288, 96, 8, 16, 1024, 1536, 1, 1, "a100-80g", 0, 0, NULL, 0, NULL, NULL, 0, 0},
    {"gpt-1t", 128, 25600, 160, 8, 64, 3072, 3072, 1, 1, "a100-80g", 163, 0, NULL, 0, NULL, NULL, 0, 0},
    /* LLaMA: the sizes are the model preset's (sequence 4096; LLaMA 3 8192). The
       llama-13b rows are Megatron-LLaMA's LLaMA-13B runs on 256 and 512 A100s
       (its README's table and examples/LLaMA/LLaMA_13_slurm.sh: tp 2, pp 1,
       sequence 2048, global batch 2048, micro-batch 4, selective recomputation,
       --reduce-bucket-size 4e8 elements, the overlapped distributed optimizer =
       ZeRO 1 with overlap; 8 A100s and 4 x 200 Gbit/s a node = 100 Gbit/s a GPU).
       The others are layouts that fit, not published runs. */
    {"llama2-7b", 0, 0, 0, 8, 1, 64, 1024, 1, 1, "a100-80g", 0, 1, "llama2-7b", 0, NULL, NULL, 0, 0},
    {"llama-13b-256", 0, 0, 0, 2, 1, 256, 2048, 4, 1, "a100-80g", 0, 1, "llama2-13b", 2048,
     "selective", "on", 4e8 * 4 / 1048576.0, 100},
    {"llama-13b-512", 0, 0, 0, 2, 1, 512, 2048, 4, 1, "a100-80g", 0, 1, "llama2-13b", 2048,
     "selective", "on", 4e8 * 4 / 1048576.0, 100},
    {"llama3-8b", 0, 0, 0, 8, 1, 64, 512, 1, 1, "a100-80g", 0, 1, "llama3-8b", 0, NULL, NULL, 0, 0},
    {"llama2-70b", 0, 0, 0, 8, 8, 512, 1024, 1, 1, "a100-80g", 0, 1, "llama2-70b", 0, NULL, NULL, 0, 0},
};

static const char *hw_file_default = "build/hw-local.txt";

/* What the command line asks for. */
typedef struct plan_args {
    pt_plan_desc d;
    const char *hw_name, *hw_file, *trace_path;
    int json, search, calibrate, stages, top;
    pt_precision precision; /* --precision: the local profile's GEMMs (0: not given, fp32) */
    double inter_gbps;      /* --inter-gbps (0: the profile's) */
} plan_args;

/* "on" or "off" into *o (NULL: leave it); 0, or -1 after saying what is wrong. */
static int plan_onoff(const char *flag, const char *v, pt_overlap *o) {
    if (!v) return 0;
    if (strcmp(v, "on") == 0) *o = PT_OVERLAP_ON;
    else if (strcmp(v, "off") == 0) *o = PT_OVERLAP_OFF;
    else {
        fprintf(stderr, "error: --%s '%s' is not on or off\n", flag, v);
        return -1;
    }
    return 0;
}

/* Today's recipe from the command line: the block (--arch, --kv-heads,
   --ffn), --attention, --tp-overlap, --pp-overlap, --pp-split, --cp-comm, --grad-accum-pass,
   --grad-allreduce. 0, or -1 after an error. */
static int plan_recipe(pt_plan_desc *d, const char *arch, int kv, int ffn, const char *attn,
                       const char *tov, const char *pov, const char *split, const char *cpc,
                       const char *gap, const char *gar) {
    pt_gpt_config *cf = &d->model.config;
    if (arch && strcmp(arch, "llama") == 0) {
        cf->arch = PT_ARCH_LLAMA, cf->norm = PT_NORM_RMS, cf->pos = PT_POS_ROPE;
        cf->mlp = PT_MLP_SWIGLU, cf->no_bias = 1, cf->untied_head = 1;
    } else if (arch && strcmp(arch, "gpt") != 0) {
        fprintf(stderr, "error: --arch '%s' is not gpt or llama\n", arch);
        return -1;
    }
    if (kv) cf->n_kv_head = kv;
    if (ffn) cf->ffn_hidden = ffn;
    if (cf->arch != PT_ARCH_LLAMA && ((kv && kv != cf->n_head) || (ffn && ffn != 4 * cf->n_embd))) {
        fprintf(stderr, "error: --kv-heads %d, --ffn %d: GPT's block has kv-heads = heads (%d) "
                "and ffn = 4 x hidden (%d); use --arch llama\n", kv, ffn, cf->n_head,
                4 * cf->n_embd);
        return -1;
    }
    if (attn && strcmp(attn, "flash") == 0) d->attention = PT_ATTN_FLASH;
    else if (attn && strcmp(attn, "plain") == 0) d->attention = PT_ATTN_PLAIN;
    else if (attn) {
        fprintf(stderr, "error: --attention '%s' is not flash or plain\n", attn);
        return -1;
    }
    if (plan_onoff("tp-overlap", tov, &d->tp_overlap) || plan_onoff("pp-overlap", pov, &d->pp_overlap))
        return -1;
    if (split && strcmp(split, "even") == 0) d->pp_split = PT_SPLIT_EVEN;
    else if (split && strcmp(split, "embedding-loss") == 0) d->pp_split = PT_SPLIT_EMBED_LOSS;
    else if (split) {
        fprintf(stderr, "error: --pp-split '%s' is not even or embedding-loss\n", split);
        return -1;
    }
    if (cpc && strcmp(cpc, "ring") == 0) d->cp_comm = PT_CP_RING;
    else if (cpc && strcmp(cpc, "allgather") == 0) d->cp_comm = PT_CP_ALLGATHER;
    else if (cpc) {
        fprintf(stderr, "error: --cp-comm '%s' is not ring or allgather\n", cpc);
        return -1;
    }
    if (gap && (strcmp(gap, "on") == 0 || strcmp(gap, "off") == 0))
        d->grad_accum_pass = strcmp(gap, "on") == 0;
    else if (gap) {
        fprintf(stderr, "error: --grad-accum-pass '%s' is not on or off\n", gap);
        return -1;
    }
    if (gar && (strcmp(gar, "on") == 0 || strcmp(gar, "off") == 0))
        d->grad_allreduce = strcmp(gar, "on") == 0;
    else if (gar) {
        fprintf(stderr, "error: --grad-allreduce '%s' is not on or off\n", gar);
        return -1;
    }
    return 0;
}

/* The command line into p (a --preset first, so that flags override it
   wherever they stand). Returns -1 to go on, else the exit status: 0 after
   --help, 2 after an error message. usage: print the usage. */
static int plan_options(int argc, char **argv, plan_args *p, int usage) {
    pt_plan_desc *d = &p->d;
    pt_gpt_desc *md = &d->model; /* the model and its layout */
    pt_gpt_config *cf = &md->config;
    const char *preset = NULL, *rc = "full", *sched = NULL, *prec = NULL, *pos[1], *ov = NULL;
    const char *arch = NULL, *attn = NULL, *tov = NULL, *pov = NULL, *split = NULL, *cpc = NULL;
    const char *gap = NULL, *gar = NULL; /* (--grad-accum-pass, --grad-allreduce) */
    int kv = 0, ffn = 0, npos, s, i, np = (int)(sizeof presets / sizeof *presets);
    float tokens = 0, bucket_mb = 0, inter = 0;
    cli_opt opts[] = {
        {"preset", CLI_STR, &preset, "megatron-1.7b, megatron-145.6b, megatron-1t, gpt-22b, "
         "gpt-175b, gpt-1t, llama2-7b, llama-13b-256, llama-13b-512 (Megatron-LLaMA's "
         "LLaMA-13B runs), llama3-8b, llama2-70b (flags after it override)", 0, 0},
        {"layers", CLI_INT, &cf->n_layer, "transformer layers", 1, 100000},
        {"hidden", CLI_INT, &cf->n_embd, "hidden size", 1, 1 << 20},
        {"heads", CLI_INT, &cf->n_head, "attention heads", 1, 1 << 16},
        {"seq", CLI_INT, &md->seq, "sequence length", 1, 1 << 20},
        {"vocab", CLI_INT, &cf->vocab_size, "vocabulary", 1, 1 << 24},
        {"tp", CLI_INT, &d->tp, "tensor-parallel ranks", 1, 1 << 16},
        {"sp", CLI_FLAG, &md->sequence_parallel, "sequence parallelism: norms, dropout, "
         "residuals on seq/tp, tp's all-reduces as all-gather + reduce-scatter (--seq a "
         "multiple of tp; nothing with tp 1; default off)", 0, 0},
        {"pp", CLI_INT, &d->pp, "pipeline stages", 1, 64},
        {"gpus", CLI_INT, &d->gpus, "devices (dp = gpus / (tp x pp))", 1, 1 << 24},
        {"batch", CLI_INT, &d->batch, "global batch (sequences)", 1, 1 << 24},
        {"microbatch", CLI_INT, &md->batch, "micro-batch (sequences)", 1, 1 << 16},
        {"chunks", CLI_INT, &md->chunks, "layer chunks a stage (0: the schedule's own, 2 for "
         "zb-v and chimera, else 1; interleaved takes 2 or more)", 0, 64},
        {"schedule", CLI_STR, &sched, "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, chimera, "
         "2bw (default: 1f1b, interleaved with --chunks)", 0, 0},
        {"zero", CLI_INT, &md->zero, "ZeRO stage 0..3 (1 with --overlap on: Megatron's "
         "distributed optimizer)", 0, 3},
        {"arch", CLI_STR, &arch, "gpt | llama: the block (llama: RMSNorm, rotary, SwiGLU, no "
         "biases, untied head; default gpt)", 0, 0},
        {"kv-heads", CLI_INT, &kv, "key/value heads (llama; default: --heads)", 1, 1 << 16},
        {"ffn", CLI_INT, &ffn, "the MLP's hidden size (default 4 x hidden)", 1, 1 << 24},
        {"cp", CLI_INT, &d->cp, "context parallelism: ranks sharing each sequence, two chunks "
         "a rank (gpus = tp x pp x cp x dp)", 1, 1 << 16},
        {"cp-comm", CLI_STR, &cpc, "ring | allgather: cp's K/V blocks round a ring behind compute, "
         "or all-gathered and exposed (Llama 3's; GPU profiles) (default ring)", 0, 0},
        {"attention", CLI_STR, &attn, "flash | plain: a fused kernel at the profile's flash "
         "efficiency; or batched GEMMs, the scores stored (default plain)", 0, 0},
        {"tp-overlap", CLI_STR, &tov, "on | off: tp's collectives pipelined against their GEMMs, "
         "the profile's exposed share left (default: on with --overlap on)", 0, 0},
        {"pp-overlap", CLI_STR, &pov, "on | off: pipeline sends behind compute (default: on with "
         "--overlap on)", 0, 0},
        {"pp-split", CLI_STR, &split, "even | embedding-loss: the layers over the pipeline's "
         "blocks, evenly (the first L mod blocks one more), or the embedding and the loss "
         "counted as a layer each, the first and last block one layer fewer (Llama 3, BLOOM; "
         "Megatron-Core's --account-for-embedding/loss-in-pipeline-split) (default: "
         "embedding-loss on a GPU profile when it divides the layers evenly and even does not)",
         0, 0},
        {"grad-accum-pass", CLI_STR, &gap, "on | off: bf16 gradients added into fp32 ones a "
         "micro-batch (DeepSpeed's, BLOOM's; default off)", 0, 0},
        {"grad-allreduce", CLI_STR, &gar, "on | off: --zero 1's gradients all-reduced whole "
         "(DeepSpeed's BF16_Optimizer; default off)", 0, 0},
        {"recompute", CLI_STR, &rc, "none, selective or full", 0, 0},
        {"hw", CLI_STR, &p->hw_name, "a100-80g, h100-80g, h200, mi250x, mi300x or local "
                                     "(default: preset's, else a100-80g)", 0, 0},
        {"hw-file", CLI_STR, &p->hw_file, "this machine's profile for --hw local", 0, 0},
        {"tokens", CLI_FLOAT, &tokens, "report the time to train on this many tokens", 0, 1e18},
        {"json", CLI_FLAG, &p->json, "one JSON object instead of the table", 0, 0},
        {"stages", CLI_FLAG, &p->stages, "also print every pipeline stage's ranks, memory, time "
                                         "and bytes", 0, 0},
        {"search", CLI_FLAG, &p->search, "search tp, pp, chunks, micro-batch, ZeRO, recompute "
         "and schedule (1f1b or interleaved, zb-h1, zb-h2, zb-v, chimera, 2bw: marked "
         "asynchronous)", 0, 0},
        {"top", CLI_INT, &p->top, "layouts --search prints", 1, 100},
        {"trace", CLI_STR, &p->trace_path, "write the simulated step as Chrome trace JSON (and "
                                           "an SVG beside it)", 0, 0},
        {"calibrate", CLI_FLAG, &p->calibrate, "measure this machine into --hw-file and exit", 0,
         0},
        {"precision", CLI_STR, &prec, "fp32 | bf16: the GEMMs' precision this machine's profile "
         "(--hw local, --calibrate) is measured at (default fp32)", 0, 0},
        {"overlap", CLI_STR, &ov, "on | off: dp gradient buckets reduced behind backward, ZeRO's "
         "parameter gathers behind the next forward, and unless --tp-overlap/--pp-overlap say "
         "otherwise tp's and the pipeline's transfers too (default: on for --hw local, ptrain's "
         "executor; off for the GPU profiles, Megatron-LM 2021's)", 0, 0},
        {"bucket-mb", CLI_FLOAT, &bucket_mb, "dp gradient buckets: layers grouped until a bucket "
         "holds this many MiB of fp32 gradients (default: a layer a bucket)", 0, 0},
        {"inter-gbps", CLI_FLOAT, &inter, "a device's network bandwidth across nodes in Gbit/s "
         "(the node's adapters over its devices; default: the profile's)", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    memset(p, 0, sizeof *p);
    p->hw_file = hw_file_default, p->top = 5;
    cf->n_layer = 24, cf->n_embd = 2304, cf->n_head = 24, cf->vocab_size = 51200;
    md->seq = 2048, md->batch = 16, md->chunks = 0;
    d->tp = 1, d->pp = 1, d->gpus = 32, d->batch = 512, d->cp = 1;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) preset = argv[i + 1];
        else if (strncmp(argv[i], "--preset=", 9) == 0) preset = argv[i] + 9;
    }
    for (i = 0; preset && i < np; i++)
        if (strcmp(presets[i].name, preset) == 0) {
            const plan_preset *q = &presets[i];
            cf->n_layer = q->layers, cf->n_embd = q->hidden, cf->n_head = q->heads;
            d->tp = q->tp, d->pp = q->pp, d->gpus = q->gpus, d->batch = q->batch;
            md->batch = q->micro, md->chunks = q->chunks, md->zero = q->zero, p->hw_name = q->hw;
            if (q->recompute) rc = q->recompute;
            if (q->overlap) ov = q->overlap;
            bucket_mb = (float)q->bucket_mb, inter = (float)q->inter_gbps;
            if (q->model) {
                if (pt_gpt_config_preset(q->model, cf) != PT_OK) { /* its sizes and block */
                    fprintf(stderr, "error: %s\n", pt_last_error());
                    return 2;
                }
                md->seq = q->seq ? q->seq : cf->block_size;
            }
            break;
        }
    if (preset && i == np) {
        fprintf(stderr, "error: unknown preset '%s' (see --help)\n", preset);
        return 2;
    }
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        if (usage) cli_usage(s == 1 ? stdout : stderr, "usage: plan [options]", opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if ((md->recompute = cli_recompute(rc)) < 0) return 2;
    if (prec && pt_precision_parse(prec, &p->precision) != PT_OK) {
        fprintf(stderr, "error: --precision: %s\n", pt_last_error());
        return 2;
    }
    if (prec && !p->calibrate && (!p->hw_name || strcmp(p->hw_name, "local") != 0)) {
        fprintf(stderr, "error: --precision is the local profile's (--hw local or --calibrate); "
                "a preset's rates are at its own training precision\n");
        return 2;
    }
    if ((s = cli_schedule(sched)) < 0) return 2;
    if (plan_onoff("overlap", ov, &d->overlap)) return 2;
    if (cli_given(argc, argv, "bucket-mb") && !(bucket_mb > 0.0f)) {
        fprintf(stderr, "error: --bucket-mb %g must be more than 0\n", (double)bucket_mb);
        return 2;
    }
    if (cli_given(argc, argv, "inter-gbps") && !(inter > 0.0f)) {
        fprintf(stderr, "error: --inter-gbps %g must be more than 0\n", (double)inter);
        return 2;
    }
    if (plan_recipe(d, arch, kv, ffn, attn, tov, pov, split, cpc, gap, gar) != 0) return 2;
    md->bucket_bytes = (size_t)((double)bucket_mb * 1048576.0);
    p->inter_gbps = inter;
    md->schedule = (pt_schedule_kind)s;
    d->train_tokens = tokens;
    return -1;
}

#endif
