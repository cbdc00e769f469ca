/* curves: loss curves of several runs in one SVG picture, and their final
   validation losses side by side.

     build/curves --out runs.svg fp32=a.loss.csv bf16=b.loss.csv [--max-diff 2]

   Each NAME=FILE is a loss history that build/train writes beside its
   checkpoint (STEM.loss.csv: step, tokens, train loss, validation loss). The
   picture has each run's validation curve and its train curve against tokens
   seen. Prints each run's last validation loss and its difference from the
   first run's in percent; with --max-diff P, exits 1 when one differs by
   more than P%. bench/precision.sh draws fp32 against bf16 with it. */
#define _POSIX_C_SOURCE 200809L /* setenv (cli.h) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/progress.h"

#include <limits.h>

#define CURVES_MAX 8

int main(int argc, char **argv) {
    const char *out = NULL, *title = "ptrain: loss";
    const char *pos[CURVES_MAX];
    float max_diff = 0.0f;
    int npos = 0, s, i, k, rc = 0;
    cli_opt opts[] = {
        {"out", CLI_STR, &out, "the SVG picture to write", 0, 0},
        {"title", CLI_STR, &title, "the picture's title", 0, 0},
        {"max-diff", CLI_FLOAT, &max_diff, "exit 1 if a run's last validation loss differs from "
         "the first run's by more than this many percent (0: no limit)", 0, 100},
    };
    progress_history h[CURVES_MAX];
    pt_plot_series ser[2 * CURVES_MAX];
    char names[CURVES_MAX][64], labels[2 * CURVES_MAX][96];
    double *xy[CURVES_MAX], first = 0.0;
    memset(h, 0, sizeof h);
    if ((s = cli_parse(argc, argv, opts, 3, pos, CURVES_MAX, &npos)) != 0 || npos < 1 || !out) {
        cli_usage(s == 1 ? stdout : stderr,
                  "usage: curves --out FILE.svg NAME=FILE.loss.csv ...\n"
                  "Draws loss histories of build/train runs in one picture.", opts, 3);
        if (s == 0 && !out) fprintf(stderr, "error: --out is required\n");
        if (s == 0 && npos < 1) fprintf(stderr, "error: give at least one NAME=FILE.loss.csv\n");
        return s == 1 ? 0 : 2;
    }
    for (i = 0; i < npos; i++) {
        const char *eq = strchr(pos[i], '=');
        FILE *f;
        if (!eq || eq == pos[i] || (size_t)(eq - pos[i]) >= sizeof names[i]) {
            fprintf(stderr, "error: '%s' is not NAME=FILE.loss.csv\n", pos[i]);
            return 2;
        }
        snprintf(names[i], sizeof names[i], "%.*s", (int)(eq - pos[i]), pos[i]);
        snprintf(h[i].csv, sizeof h[i].csv, "%s", eq + 1);
        if (!(f = fopen(h[i].csv, "r"))) {
            fprintf(stderr, "error: cannot read %s: %s\n", h[i].csv, strerror(errno));
            return 2;
        }
        fclose(f);
        progress_history_load(&h[i], LLONG_MAX);
        if (h[i].n == 0) {
            fprintf(stderr, "error: %s holds no loss history rows\n", h[i].csv);
            return 2;
        }
    }
    for (i = 0; i < npos; i++) { /* per run: tokens and losses of its validation, then train rows */
        int nv = 0, nt = 0;
        double last = NAN;
        if (!(xy[i] = (double *)malloc(4 * sizeof(double) * (size_t)h[i].n))) return 2;
        for (k = 0; k < h[i].n; k++) {
            const progress_row *r = &h[i].rows[k];
            if (r->val == r->val) {
                xy[i][nv] = (double)r->tokens, xy[i][h[i].n + nv++] = r->val;
                last = r->val;
            }
            if (r->train == r->train)
                xy[i][2 * h[i].n + nt] = (double)r->tokens, xy[i][3 * h[i].n + nt++] = r->train;
        }
        snprintf(labels[2 * i], sizeof labels[0], "%s validation", names[i]);
        snprintf(labels[2 * i + 1], sizeof labels[0], "%s train", names[i]);
        ser[2 * i].name = labels[2 * i], ser[2 * i].x = xy[i], ser[2 * i].y = xy[i] + h[i].n;
        ser[2 * i].n = nv;
        ser[2 * i + 1].name = labels[2 * i + 1], ser[2 * i + 1].x = xy[i] + 2 * h[i].n;
        ser[2 * i + 1].y = xy[i] + 3 * h[i].n, ser[2 * i + 1].n = nt;
        if (i == 0) first = last;
        if (last != last) {
            printf("%-12s no validation loss in %s\n", names[i], h[i].csv);
            rc = 1;
        } else if (i == 0) {
            printf("%-12s final validation loss %.4f\n", names[i], last);
        } else {
            double d = 100.0 * (last - first) / first;
            printf("%-12s final validation loss %.4f (%+.2f%% vs %s)\n", names[i], last, d,
                   names[0]);
            if (max_diff > 0.0f && fabs(d) > max_diff) rc = 1;
        }
    }
    if (pt_plot_write_svg(out, title, "tokens seen", "loss (nats/token)", ser, 2 * npos) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        rc = 2;
    } else {
        printf("picture: %s\n", out);
    }
    for (i = 0; i < npos; i++) free(xy[i]), progress_history_free(&h[i]);
    return rc;
}
