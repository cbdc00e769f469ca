/* peak.h -- the instruction peak MFU is measured against, measured once per
   machine and kept.

   pt_instr_peak_gflops runs the CPU's widest multiply-add on every thread
   for a quarter of a second. On a machine that is busy with other work its
   threads lose their cores part of the time and it reads low (254-272
   GFLOP/s against 507-539 idle on 2 Zen cores under a load of 3): the MFU
   of the same run would then read twice as high. So the measurement is
   kept in a small file per CPU model, thread count and precision,

     $PTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/ptrain, else ~/.cache/ptrain:
     peak-<cpu model>-<threads>t-<fp32|bf16-kernel>

   holding the GFLOP/s, when it was measured and whether it looked taken
   under load: the share of its threads' time the process had (CPU time over
   wall time x threads, below 85% = loaded). A kept peak measured idle is
   used as it is; one measured under load is measured again on each run,
   keeping the larger, until a run measures idle; refresh (train --measure-peak) measures and
   replaces it. The peak is a ceiling: a measurement can only fall short of
   it, so the larger of two is kept. Include after ptrain.h and cli.h. */
#ifndef PTRAIN_PEAK_H
#define PTRAIN_PEAK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct peak_info {
    double gflops;     /* the instruction peak (0: no probe on this CPU) */
    int cached;        /* taken from the cache file without measuring */
    int loaded;        /* the kept (or this) measurement looked taken under load */
    double share;      /* the share of its threads' time the measuring process had */
    double load1;      /* the 1-minute load average when measured (-1: unknown) */
    int cores;         /* the cores the load average compares with */
    char when[32];     /* when the kept value was measured (UTC) */
    char path[4096];   /* the cache file ("": none: no directory for it) */
} peak_info;

#define PEAK_LOADED_SHARE 0.85 /* below this share of its threads' time: under load */

/* The cache file of this CPU, thread count and precision into buf ("" when
   there is no directory for it). */
static void peak_cache_path(char *buf, size_t n, int bf16, int threads) {
    const char *dir = getenv("PTRAIN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char model[128] = "cpu", line[512], base[3072];
    FILE *f = fopen("/proc/cpuinfo", "r");
    size_t i, k = 0;
    buf[0] = 0;
    if (dir && *dir) snprintf(base, sizeof base, "%s", dir);
    else if (xdg && *xdg) snprintf(base, sizeof base, "%s/ptrain", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache/ptrain", home);
    else return;
    while (f && fgets(line, sizeof line, f)) { /* "model name : AMD EPYC 9R45 ..." */
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        for (i = 1; colon[i] && k + 1 < sizeof model; i++) { /* letters and digits, '-' between */
            char c = colon[i];
            int keep = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
            if (keep) model[k++] = c;
            else if (k > 0 && model[k - 1] != '-') model[k++] = '-';
        }
        while (k > 0 && model[k - 1] == '-') k--;
        model[k] = 0;
        break;
    }
    if (f) fclose(f);
    if (k == 0) snprintf(model, sizeof model, "cpu");
    snprintf(buf, n, "%s/peak-%s-%dt-%s%s", base, model, threads, bf16 ? "bf16-" : "fp32",
             bf16 ? pt_gemm_bf16_name() : "");
}

/* The kept value of path into p; 1 if there is one. */
static int peak_cache_read(const char *path, peak_info *p) {
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    double g = 0.0, share = 1.0, load1 = -1.0;
    int loaded = 0, cores = 0, ok;
    char when[32] = "";
    if (!f) return 0;
    ok = fscanf(f, "gflops %lf loaded %d share %lf load1 %lf cores %d measured %31s", &g, &loaded,
                &share, &load1, &cores, when) == 6 && g > 0.0 && g < 1e12;
    fclose(f);
    if (!ok) return 0;
    p->gflops = g, p->loaded = loaded != 0, p->share = share, p->load1 = load1;
    p->cores = cores;
    snprintf(p->when, sizeof p->when, "%s", when);
    return 1;
}

/* Writes p to path through a temporary file (creating its directory, one
   level); a failure only means the next run measures again. */
static void peak_cache_write(const char *path, const peak_info *p) {
    char tmp[4200], dir[4096];
    const char *slash = strrchr(path, '/');
    FILE *f;
    if (!path[0]) return;
    if (slash) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        cli_mkdirs(dir);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "w"))) return;
    fprintf(f, "gflops %.3f loaded %d share %.3f load1 %.2f cores %d measured %s\n", p->gflops,
            p->loaded, p->share, p->load1, p->cores, p->when);
    if (fclose(f) != 0 || rename(tmp, path) != 0) remove(tmp);
}

/* The 1-minute load average (-1 where unknown). */
static double peak_load1(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l = -1.0;
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1.0;
        fclose(f);
    }
    return l;
}

/* One measurement on the current threads, with the share of their time the
   process had while it ran. */
static void peak_measure(int bf16, peak_info *p) {
    int threads = pt_get_threads();
    double t0 = pt_time_now(), wall;
    clock_t c0 = clock();
    time_t now = time(NULL);
    p->load1 = peak_load1();
    p->gflops = pt_instr_peak_gflops(bf16, 0.25);
    wall = pt_time_now() - t0;
    p->share = wall > 0.0 && c0 != (clock_t)-1
                   ? (double)(clock() - c0) / CLOCKS_PER_SEC / (wall * (threads > 0 ? threads : 1))
                   : 1.0;
    p->loaded = p->share < PEAK_LOADED_SHARE;
    strftime(p->when, sizeof p->when, "%Y-%m-%dT%H:%MZ", gmtime(&now));
}

/* The instruction peak at this precision on the current threads, from the
   cache when it holds an idle measurement (and not refresh), else measured
   (and kept). cores: the machine's, for the load average beside it. */
static void peak_instr(int bf16, int refresh, int cores, peak_info *p) {
    peak_info kept, now;
    int have;
    memset(p, 0, sizeof *p);
    memset(&kept, 0, sizeof kept);
    peak_cache_path(p->path, sizeof p->path, bf16, pt_get_threads());
    have = !refresh && peak_cache_read(p->path, &kept);
    if (have && !kept.loaded) {
        kept.cached = 1;
        snprintf(kept.path, sizeof kept.path, "%s", p->path);
        *p = kept;
        return;
    }
    memset(&now, 0, sizeof now);
    peak_measure(bf16, &now);
    now.cores = cores;
    snprintf(now.path, sizeof now.path, "%s", p->path);
    if (now.gflops <= 0.0) { /* no probe on this CPU: nothing to keep */
        *p = now;
        return;
    }
    if (have && kept.gflops > now.gflops) { /* the larger is nearer the ceiling */
        snprintf(kept.path, sizeof kept.path, "%s", p->path);
        *p = kept;
        p->cached = 1;
        return;
    }
    *p = now;
    peak_cache_write(p->path, p);
}

#endif
