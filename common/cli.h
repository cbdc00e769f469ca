/* cli.h -- what ptrain's programs (train, sample, fixture_check, bench)
   share: the option parser, starting their world of ranks, and printing
   byte-level tokens as text. An option table drives parsing and --help, so a
   program gains a flag by adding one row. Values are checked strictly: a
   malformed or out-of-range number is an error, never a silent default. */
#ifndef PTRAIN_CLI_H
#define PTRAIN_CLI_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#if defined(__linux__)
#include <unistd.h>
#endif

typedef enum { CLI_INT, CLI_U64, CLI_FLOAT, CLI_STR, CLI_FLAG } cli_kind;

typedef struct cli_opt {
    const char *name; /* without the leading "--" */
    cli_kind kind;
    void *ptr;        /* int*, uint64_t*, float*, const char**, int* (flag) */
    const char *help;
    double lo, hi;    /* allowed range for numbers (lo == hi: any) */
} cli_opt;

/* OpenMP threads that spin at barriers take a core from any other process
   that needs it, and then wait on it: beside one busy process a 2-thread step
   took 2.6x its time alone, 1.9x with passive waiting, and alone the two are
   within noise (bench/contention.sh measures it). libgomp reads OMP_WAIT_POLICY when it
   loads, before main, so the programs re-execute themselves once with
   OMP_WAIT_POLICY=passive. An OMP_WAIT_POLICY or GOMP_SPINCOUNT already set
   is respected. Needs _POSIX_C_SOURCE >= 200112L for setenv and execv. */
static inline void cli_passive_wait(char **argv) {
#if defined(__linux__)
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* exec failed: go on with the runtime's own policy */
#else
    (void)argv;
#endif
}

/* A program's world: under PTRAIN_MPI the processes mpirun started, else
   this process alone (ranks are then threads: cli_world_run). Re-executes
   for passive OpenMP waiting first, before MPI starts. 0 if MPI fails. */
static inline int cli_world_begin(pt_comm *world, int *argc, char ***argv) {
    cli_passive_wait(*argv);
#ifdef PTRAIN_MPI
    if (pt_comm_mpi_init(world, argc, argv) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 0;
    }
#else
    (void)argc;
    pt_comm_self(world);
#endif
    return 1;
}

static inline void cli_world_end(pt_comm *world) {
    pt_comm_free(world);
#ifdef PTRAIN_MPI
    pt_comm_mpi_finalize();
#endif
}

/* Runs fn on every rank: the MPI processes (each calls it once), or n
   threads of this process (n = 1: this thread). */
static inline pt_status cli_world_run(pt_comm *world, int n,
                                      pt_status (*fn)(pt_comm *world, void *arg), void *arg) {
    if (world->kind == PT_COMM_MPI || n == 1) return fn(world, arg);
    return pt_comm_threads_run(n, fn, arg);
}

/* An int that world rank 0 knows, shared with every rank (a verdict). */
static inline pt_status cli_world_share(pt_comm *world, int *value) {
    float f = (float)*value;
    pt_status st = pt_comm_broadcast(world, &f, 1, 0);
    *value = (int)f;
    return st;
}

/* --recompute none|selective|full as PT_RECOMPUTE_*, or -1 after an error message */
static inline int cli_recompute(const char *name) {
    if (strcmp(name, "none") == 0) return PT_RECOMPUTE_NONE;
    if (strcmp(name, "selective") == 0) return PT_RECOMPUTE_SELECTIVE;
    if (strcmp(name, "full") == 0) return PT_RECOMPUTE_FULL;
    fprintf(stderr, "error: --recompute '%s' is not none, selective or full\n", name);
    return -1;
}

/* --schedule NAME as a pt_schedule_kind (NULL: 0, the default), or -1 after
   an error message */
static inline int cli_schedule(const char *name) {
    pt_schedule_kind k = PT_SCHED_DEFAULT;
    if (name && pt_schedule_kind_parse(name, &k) != PT_OK) {
        fprintf(stderr, "error: --schedule: %s\n", pt_last_error());
        return -1;
    }
    return (int)k;
}

static inline void cli_usage(FILE *f, const char *usage, const cli_opt *o, int n) {
    int i;
    fprintf(f, "%s\n\noptions:\n", usage);
    for (i = 0; i < n; i++) {
        char arg[64];
        const char *meta = o[i].kind == CLI_INT || o[i].kind == CLI_U64 ? " N"
                           : o[i].kind == CLI_FLOAT                      ? " X"
                           : o[i].kind == CLI_STR                        ? " S"
                                                                          : "";
        snprintf(arg, sizeof arg, "--%s%s", o[i].name, meta);
        fprintf(f, "  %-24s %s", arg, o[i].help);
        if (o[i].kind == CLI_INT) fprintf(f, " (default %d)", *(int *)o[i].ptr);
        else if (o[i].kind == CLI_U64)
            fprintf(f, " (default %llu)", (unsigned long long)*(uint64_t *)o[i].ptr);
        else if (o[i].kind == CLI_FLOAT) fprintf(f, " (default %g)", (double)*(float *)o[i].ptr);
        else if (o[i].kind == CLI_STR && *(const char **)o[i].ptr)
            fprintf(f, " (default %s)", *(const char **)o[i].ptr);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-24s %s\n", "--help", "show this help");
}

static inline int cli_value(const cli_opt *o, const char *v) {
    char *end;
    double d;
    errno = 0;
    if (o->kind == CLI_STR) {
        *(const char **)o->ptr = v;
        return 0;
    }
    if (o->kind == CLI_FLOAT) d = strtod(v, &end);
    else if (o->kind == CLI_U64) {
        unsigned long long u;
        if (*v == '-') goto bad;
        u = strtoull(v, &end, 10);
        if (*v == 0 || *end || errno) goto bad;
        *(uint64_t *)o->ptr = (uint64_t)u;
        return 0;
    } else d = (double)strtoll(v, &end, 10);
    if (*v == 0 || *end || errno || d != d) goto bad;
    if (o->lo != o->hi && (d < o->lo || d > o->hi)) {
        fprintf(stderr, "error: --%s %s is outside [%g, %g]\n", o->name, v, o->lo, o->hi);
        return -1;
    }
    if (o->kind == CLI_INT) {
        if (d < INT_MIN || d > INT_MAX) goto bad;
        *(int *)o->ptr = (int)d;
    } else {
        *(float *)o->ptr = (float)d;
    }
    return 0;
bad:
    fprintf(stderr, "error: --%s expects %s, got '%s'\n", o->name,
            o->kind == CLI_FLOAT ? "a number" : "an integer", v);
    return -1;
}

/* Returns 0 on success, 1 if --help was given, -1 on error (message printed).
   Arguments not starting with "--" are collected into pos (at most max_pos). */
static inline int cli_parse(int argc, char **argv, const cli_opt *o, int n, const char **pos, int max_pos,
                     int *npos) {
    int i, k;
    *npos = 0;
    /* --help anywhere wins before any value is stored, so the usage's
       defaults are the program's, not the other arguments' */
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0) return 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *val = NULL;
        size_t len;
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            if (*npos >= max_pos) {
                fprintf(stderr, "error: unexpected argument '%s'\n", a);
                return -1;
            }
            pos[(*npos)++] = a;
            continue;
        }
        a += 2;
        eq = strchr(a, '=');
        len = eq ? (size_t)(eq - a) : strlen(a);
        for (k = 0; k < n; k++)
            if (strlen(o[k].name) == len && strncmp(o[k].name, a, len) == 0) break;
        if (k == n) {
            fprintf(stderr, "error: unknown option '--%.*s' (see --help)\n", (int)len, a);
            return -1;
        }
        if (o[k].kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "error: --%s takes no value\n", o[k].name);
                return -1;
            }
            *(int *)o[k].ptr = 1;
            continue;
        }
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else {
            fprintf(stderr, "error: --%s needs a value\n", o[k].name);
            return -1;
        }
        if (cli_value(&o[k], val) != 0) return -1;
    }
    return 0;
}

/* 1 if --name is on the command line (as --name V or --name=V): for checks of
   options that only mean something with others. */
static inline int cli_given(int argc, char **argv, const char *name) {
    size_t len = strlen(name);
    int i;
    for (i = 1; i < argc; i++)
        if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, len) == 0 &&
            (argv[i][2 + len] == 0 || argv[i][2 + len] == '='))
            return 1;
    return 0;
}

/* A benchmark's data: n random token ids in [0, vocab) for the inputs and
   the targets, from seed. Returns 0 if it cannot allocate (*x and *y are
   then NULL or to be freed as usual). */
static inline int cli_random_batch(int n, int vocab, uint64_t seed, int **x, int **y) {
    pt_rng rng;
    int i;
    *x = (int *)malloc(sizeof(int) * (size_t)n);
    *y = (int *)malloc(sizeof(int) * (size_t)n);
    if (!*x || !*y) return 0;
    pt_rng_seed(&rng, seed);
    for (i = 0; i < n; i++)
        (*x)[i] = (int)(pt_rng_u64(&rng) % (uint64_t)vocab),
        (*y)[i] = (int)(pt_rng_u64(&rng) % (uint64_t)vocab);
    return 1;
}

/* qsort's order of doubles, and the median of v's n values (v is sorted) */
static inline int cli_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static inline double cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cli_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* 1 if path names a directory */
static inline int cli_is_dir(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

/* Makes dir and the directories above it that are missing (best effort:
   whoever writes there reports a failure). */
static inline void cli_mkdirs(const char *dir) {
    char p[4096];
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof p) return;
    memcpy(p, dir, n + 1);
    for (i = 1; i <= n; i++)
        if (p[i] == '/' || p[i] == 0) {
            char c = p[i];
            p[i] = 0;
            if (!cli_is_dir(p)) mkdir(p, 0777);
            p[i] = c;
        }
}

/* 0 if a file can be made at path (PATH.probe, created and removed), else
   the errno that says why not. */
static inline int cli_writable(const char *path) {
    char probe[4200];
    FILE *f;
    snprintf(probe, sizeof probe, "%s.probe", path);
    if (!(f = fopen(probe, "w"))) return errno ? errno : EACCES;
    fclose(f);
    remove(probe);
    return 0;
}

/* Before any work: can a file be made at path (PATH.probe, created and
   removed; path itself no directory)? 1 if so, else 0 with "error: OPT
   PATH: ..." and the reason printed; before: what would otherwise find out
   at its end ("training"). */
static inline int cli_probe_write(const char *opt, const char *path, const char *before) {
    int err;
    if (cli_is_dir(path)) {
        fprintf(stderr, "error: %s %s is a directory: give a file name\n", opt, path);
        return 0;
    }
    if ((err = cli_writable(path)) != 0) {
        fprintf(stderr, "error: %s %s: cannot create a file there (%s): fix the path before %s\n",
                opt, path, strerror(err), before);
        return 0;
    }
    return 1;
}

/* Every model preset by family, "GPT-2: tiny, ...; LLaMA: llama-tiny, ...". */
static inline void cli_presets(char *buf, size_t n) {
    size_t used = 0;
    int fam;
    buf[0] = 0;
    for (fam = 0; fam < 2; fam++) { /* GPT-2's, then LLaMA's */
        const char *names = pt_gpt_preset_names();
        int first = 1;
        while (*names && used < n) {
            size_t len = strcspn(names, ", ");
            char name[64];
            pt_gpt_config c;
            snprintf(name, sizeof name, "%.*s", (int)len, names);
            if (pt_gpt_config_preset(name, &c) == PT_OK && (c.arch == PT_ARCH_LLAMA) == fam) {
                const char *sep = !first ? ", " : fam ? "; LLaMA: " : "GPT-2: ";
                used += (size_t)snprintf(buf + used, n - used, "%s%s", sep, name);
                first = 0;
            }
            names += len;
            names += strspn(names, ", ");
        }
    }
}

/* The architecture of c in words: its family and the choices that set it
   apart, "GPT-2 (LayerNorm, GELU, learned positions)" or "LLaMA (RMSNorm,
   SwiGLU 176 wide, rotary positions, 2 key/value heads, untied head)". */
static inline void cli_model_arch(const pt_gpt_config *c, char *buf, size_t n) {
    char ffn[32] = "", kv[48] = "", theta[32] = "", scaling[48] = "";
    if (c->ffn_hidden > 0 && c->ffn_hidden != 4 * c->n_embd)
        snprintf(ffn, sizeof ffn, " %d wide", c->ffn_hidden);
    if (c->n_kv_head > 0 && c->n_kv_head != c->n_head)
        snprintf(kv, sizeof kv, ", %d key/value head%s", c->n_kv_head, c->n_kv_head > 1 ? "s" : "");
    if (c->pos == PT_POS_ROPE && c->rope_theta > 0.0f && c->rope_theta != 10000.0f)
        snprintf(theta, sizeof theta, " (theta %g)", (double)c->rope_theta);
    if (c->pos == PT_POS_ROPE && c->rope_scaling.factor > 0.0f)
        snprintf(scaling, sizeof scaling, ", LLaMA 3 scaling x%g", (double)c->rope_scaling.factor);
    snprintf(buf, n, "%s (%s, %s%s, %s%s%s%s%s%s)", c->arch == PT_ARCH_LLAMA ? "LLaMA" : "GPT-2",
             c->norm == PT_NORM_RMS ? "RMSNorm" : "LayerNorm",
             c->mlp == PT_MLP_SWIGLU ? "SwiGLU" : "GELU", ffn,
             c->pos == PT_POS_ROPE ? "rotary positions" : "learned positions", theta, scaling, kv,
             c->no_bias ? ", no biases" : "", c->untied_head ? ", untied head" : "");
}

/* The tokenizer.json of a Hugging Face model directory into buf; 0 if path
   is no directory or has none. */
static inline int cli_model_tokenizer(const char *path, char *buf, size_t n) {
    FILE *f;
    if (!cli_is_dir(path)) return 0;
    snprintf(buf, n, "%s/tokenizer.json", path);
    if (!(f = fopen(buf, "rb"))) return 0;
    fclose(f);
    return 1;
}

/* ids as the tokenizer's bytes; ids it lacks (a padded vocabulary) as [id N] */
static inline void cli_print_text(const pt_tokenizer *tk, const int *ids, int n) {
    int i;
    for (i = 0; i < n; i++) {
        size_t len;
        const unsigned char *b = pt_tokenizer_bytes(tk, ids[i], &len);
        if (b) fwrite(b, 1, len, stdout);
        else printf("[id %d]", ids[i]);
    }
}

/* Byte-level tokens as text: printable ASCII, newline and tab as they are,
   anything else as '?'. */
static inline void cli_print_bytes(const int *tok, int n) {
    int i;
    for (i = 0; i < n; i++) {
        int c = tok[i];
        putchar(c == '\n' || c == '\t' || (c >= 32 && c < 127) ? c : '?');
    }
}

/* This process's peak resident memory in KiB (Linux: VmHWM), -1 if unknown. */
static inline long cli_peak_rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = strtol(line + 6, NULL, 10);
    fclose(f);
    return kb;
}

#endif
