/* ckpt.h -- the checkpoint files of a training run (build/train): naming,
   rotation, and finding the newest one that loads.

   Without --keep a run has one checkpoint, --checkpoint PATH, replaced at
   every save. With --keep N each save is a file of its own beside it,
   STEM-step00001600.safetensors (STEM: PATH without ".safetensors"), and the
   newest N are kept. --resume latest takes the newest of them that loads
   whole, else PATH, else starts fresh: the same command restarts a crashed
   run. Include after ptrain.h and cli.h. */
#ifndef PTRAIN_CKPT_H
#define PTRAIN_CKPT_H

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void ckpt_step_path(char *buf, size_t n, const char *base, long long step) {
    size_t len = strlen(base);
    if (len > 12 && strcmp(base + len - 12, ".safetensors") == 0) len -= 12;
    snprintf(buf, n, "%.*s-step%08lld.safetensors", (int)len, base, step);
}

/* Steps of base's step files (tmp = 1: of their leftover .tmp files), newest
   first; returns how many (at most max). */
static int ckpt_list(const char *base, int tmp, long long *steps, int max) {
    char dir[4096], pre[1024];
    const char *slash = strrchr(base, '/'), *name;
    size_t len = strlen(base), plen;
    DIR *d;
    struct dirent *e;
    int n = 0, i, j;
    if (len > 12 && strcmp(base + len - 12, ".safetensors") == 0) len -= 12;
    name = slash ? slash + 1 : base;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - base) + 1 : 1, slash ? base : ".");
    snprintf(pre, sizeof pre, "%.*s-step", (int)(base + len - name), name);
    plen = strlen(pre);
    if (!(d = opendir(dir))) return 0;
    while ((e = readdir(d)) != NULL && n < max) {
        const char *p = e->d_name + plen;
        char *end;
        long long st;
        if (strncmp(e->d_name, pre, plen) != 0 || *p < '0' || *p > '9') continue;
        st = strtoll(p, &end, 10);
        if (strcmp(end, tmp ? ".safetensors.tmp" : ".safetensors") != 0) continue;
        for (i = 0; i < n && steps[i] > st; i++) {
        }
        for (j = n++; j > i; j--) steps[j] = steps[j - 1];
        steps[i] = st;
    }
    closedir(d);
    return n;
}

#define CKPT_MAX 4096 /* step files looked at */

/* The step a checkpoint file was saved at, or -1 after an error. */
static long long ckpt_file_step(const char *path) {
    pt_safetensors st;
    uint64_t v = 0;
    const char *x;
    memset(&st, 0, sizeof st);
    if (pt_st_load(&st, path) != PT_OK) return -1;
    x = pt_st_meta_get(&st, "step");
    if (!x || sscanf(x, "%" SCNu64, &v) != 1 || v > INT64_MAX) {
        pt_error(PT_ERR_FORMAT, "%s: no step in its metadata: not a ptrain checkpoint", path);
        pt_st_free(&st);
        return -1;
    }
    pt_st_free(&st);
    return (long long)v;
}

/* After a save of step `step` with --keep: of the step files up to it, all
   but the newest keep go, and so do .tmp files older saves left behind (a
   kill mid-write). Later ones can only be damaged files --resume latest
   skipped: they stay until this run overwrites them. */
static void ckpt_rotate(const char *base, int keep, long long step) {
    long long steps[CKPT_MAX];
    char path[4096], tmp[4100];
    int n = ckpt_list(base, 0, steps, CKPT_MAX), i, kept = 0;
    for (i = 0; i < n; i++) {
        if (steps[i] > step || kept++ < keep) continue;
        ckpt_step_path(path, sizeof path, base, steps[i]);
        remove(path);
    }
    n = ckpt_list(base, 1, steps, CKPT_MAX);
    for (i = 0; i < n; i++)
        if (steps[i] < step) {
            ckpt_step_path(path, sizeof path, base, steps[i]);
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            remove(tmp);
        }
}

/* --resume latest: into out, the newest checkpoint of base that loads whole
   (checksums verified), skipping damaged ones with a warning. 1 if found, 0
   if there is none, -1 if there are some but none loads (a fresh start would
   overwrite them). */
static int ckpt_latest(const char *base, char *out, size_t n, int verbose) {
    long long steps[CKPT_MAX];
    pt_gpt_config cfg;
    int count = ckpt_list(base, 0, steps, CKPT_MAX), i;
    for (i = 0; i <= count; i++) {
        FILE *f;
        if (i < count) ckpt_step_path(out, n, base, steps[i]);
        else snprintf(out, n, "%s", base);
        if (i == count && !(f = fopen(out, "rb"))) return count > 0 ? -1 : 0;
        if (i == count) fclose(f);
        if (pt_gpt_config_from_file(out, 0, &cfg) == PT_OK) return 1;
        if (verbose) fprintf(stderr, "warning: --resume latest skips %s\n", pt_last_error());
    }
    return -1;
}

/* Before a run's first step: can a file be made beside base? 1 if so, else
   0 with the reason printed. A run would otherwise find out at its first
   save. */
static int ckpt_probe(const char *base) {
    return cli_probe_write("--checkpoint", base, "training");
}

/* A new run (no --resume) with --checkpoint base must not replace a file
   already there -- another run's checkpoint -- unless forced. 1 if it may
   go on, else 0 with the message printed. */
static int ckpt_fresh_ok(const char *base, int force) {
    FILE *f = fopen(base, "rb");
    long long step;
    if (!f || force) {
        if (f) fclose(f);
        return 1;
    }
    fclose(f);
    if ((step = ckpt_file_step(base)) >= 0)
        fprintf(stderr, "error: %s is the checkpoint of another run (step %lld): continue it with "
                "--resume latest, or start over in its place with --force\n", base, step);
    else
        fprintf(stderr, "error: %s exists and is not a ptrain checkpoint (%s): a new run would "
                "replace it; choose another --checkpoint, or replace it with --force\n", base,
                pt_last_error());
    return 0;
}

#endif
