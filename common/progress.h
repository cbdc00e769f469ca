/* progress.h -- what a training run shows: elapsed times and ETAs, and the
   measured timeline of a step as pictures. Include after ptrain.h. */
#ifndef PTRAIN_PROGRESS_H
#define PTRAIN_PROGRESS_H

#include <math.h>
#include <stdio.h>

/* seconds as "1h02m" or "3m07s" */
static void progress_time(char *buf, size_t n, double s) {
    if (s < 0 || s != s) s = 0;
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* The timed step's actions of every rank, to rank 0, written as Chrome trace
   JSON at path and as an SVG picture at path.svg. Collective over world. */
static pt_status progress_write_trace(pt_trace *t, pt_comm *world, const char *path, int step) {
    pt_status st = pt_trace_gather(t, world);
    char svg[4096];
    if (st != PT_OK || world->rank != 0) return st;
    t->title = "ptrain training step (measured)";
    t->track_name = "rank";
    snprintf(svg, sizeof svg, "%s.svg", path);
    if ((st = pt_trace_write_chrome(t, path)) == PT_OK && (st = pt_trace_write_svg(t, svg)) == PT_OK)
        printf("trace of step %d: %s (chrome://tracing) and %s\n", step, path, svg);
    return st;
}

#endif
