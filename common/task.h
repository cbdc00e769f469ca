/* task.h -- the embedded task of build/train (what `make run` learns): a
   generated corpus of lines that are either additions ("7+5=12") or
   sentences from a small grammar ("the old man finds a green letter near
   the river."), and the checks of what a model learned: the sentences of a
   sample that follow the grammar, the sums it gets right, and the accuracy
   of greedy answers to fresh additions. Include after ptrain.h. */
#ifndef PTRAIN_TASK_H
#define PTRAIN_TASK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *task_subjects[] = {"the cat", "the dog", "a bird", "my friend", "the old man",
                                 "a small child", "the teacher", "our neighbour"};
static const char *task_verbs[] = {"sees", "likes", "finds", "paints", "follows", "carries", "reads",
                              "hears"};
static const char *task_adjectives[] = {"red", "big", "quiet", "happy", "old", "little", "green",
                                   "bright"};
static const char *task_objects[] = {"ball", "book", "tree", "house", "river", "song", "letter",
                                "garden"};
#define TASK_ADD_MAX 10 /* operands of the additions are below this */
#define TASK_PICK(arr, r) arr[pt_rng_u64(r) % (sizeof arr / sizeof arr[0])]

/* n bytes of lines; returns the buffer (caller frees) */
static char *task_corpus(size_t n, uint64_t seed) {
    char *buf = (char *)malloc(n + 256), line[256];
    size_t used = 0;
    pt_rng r;
    if (!buf) return NULL;
    pt_rng_seed(&r, seed);
    while (used < n) {
        int len;
        if (pt_rng_u64(&r) % 3 != 0) { /* two lines in three are additions */
            int a = (int)(pt_rng_u64(&r) % TASK_ADD_MAX);
            int b = (int)(pt_rng_u64(&r) % TASK_ADD_MAX);
            len = snprintf(line, sizeof line, "%d+%d=%d\n", a, b, a + b);
        } else if (pt_rng_u64(&r) % 2) {
            len = snprintf(line, sizeof line, "%s %s the %s %s.\n",
                           TASK_PICK(task_subjects, &r), TASK_PICK(task_verbs, &r),
                           TASK_PICK(task_adjectives, &r), TASK_PICK(task_objects, &r));
        } else {
            len = snprintf(line, sizeof line, "%s %s a %s %s near the %s.\n",
                           TASK_PICK(task_subjects, &r), TASK_PICK(task_verbs, &r),
                           TASK_PICK(task_adjectives, &r), TASK_PICK(task_objects, &r),
                           TASK_PICK(task_objects, &r));
        }
        memcpy(buf + used, line, (size_t)len);
        used += (size_t)len;
    }
    return buf;
}

/* Advances *p past the first entry of list (n entries) that prefixes it. */
static int task_eat(const char **p, const char *const *list, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        size_t len = strlen(list[i]);
        if (strncmp(*p, list[i], len) == 0) {
            *p += len;
            return 1;
        }
    }
    return 0;
}
#define TASK_EAT(p, arr) task_eat(p, arr, sizeof arr / sizeof arr[0])
#define TASK_EAT1(p, word) task_eat(p, &(const char *){word}, 1)

/* 1 if line is a sentence of the grammar above */
static int task_is_sentence(const char *line) {
    const char *p = line;
    int near;
    if (!TASK_EAT(&p, task_subjects) || !TASK_EAT1(&p, " ") || !TASK_EAT(&p, task_verbs))
        return 0;
    near = TASK_EAT1(&p, " a ");
    if (!near && !TASK_EAT1(&p, " the ")) return 0;
    if (!TASK_EAT(&p, task_adjectives) || !TASK_EAT1(&p, " ") || !TASK_EAT(&p, task_objects))
        return 0;
    if (near && (!TASK_EAT1(&p, " near the ") || !TASK_EAT(&p, task_objects))) return 0;
    return strcmp(p, ".") == 0;
}

/* Scores the complete lines of a byte sample: sentences that follow the
   grammar, and additions that are correct. */
static void task_score_sample(const int *tok, int n) {
    char line[256];
    int len = 0, i, sentences = 0, grammatical = 0, sums = 0, correct = 0;
    for (i = 0; i < n; i++) {
        int a, b, c, used = 0;
        if (tok[i] != '\n') {
            if (len < (int)sizeof line - 1) line[len++] = (char)tok[i];
            continue;
        }
        line[len] = 0;
        len = 0;
        if (line[0] >= '0' && line[0] <= '9') {
            sums++;
            correct += sscanf(line, "%d+%d=%d%n", &a, &b, &c, &used) == 3 &&
                       line[used] == 0 && a + b == c;
        } else if (line[0]) {
            sentences++;
            grammatical += task_is_sentence(line);
        }
    }
    printf("in the sample: %d of %d sentences follow the grammar, %d of %d sums are correct\n",
           grammatical, sentences, correct, sums);
}

/* Greedy answers to fresh "a+b=" prompts; returns the fraction correct. */
static double task_addition_accuracy(const pt_gpt *gpt, pt_kv_cache *cache, int trials,
                                     uint64_t seed) {
    pt_rng r;
    pt_sample_desc greedy = {0.0f, 0, 0};
    int correct = 0, i;
    pt_rng_seed(&r, seed);
    for (i = 0; i < trials; i++) {
        int a = (int)(pt_rng_u64(&r) % TASK_ADD_MAX), b = (int)(pt_rng_u64(&r) % TASK_ADD_MAX);
        int k, n;
        int prompt[16], out[8];
        char text[16], want[8], got[9];
        n = snprintf(text, sizeof text, "\n%d+%d=", a, b);
        for (k = 0; k < n; k++) prompt[k] = (unsigned char)text[k];
        snprintf(want, sizeof want, "%d\n", a + b);
        if (pt_gpt_generate(gpt, cache, prompt, n, out, (int)strlen(want), &greedy) != PT_OK)
            return 0.0;
        for (k = 0; k < (int)strlen(want); k++) got[k] = (char)out[k];
        got[strlen(want)] = 0;
        correct += strcmp(got, want) == 0;
    }
    return (double)correct / trials;
}

#endif
