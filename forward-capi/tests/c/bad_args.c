/*
 * Bad arguments to every kind of entry point: each must come back as the documented status code
 * with a message naming what was wrong, and leave the handle as it was (no slot filled, no output
 * written). Controls: the matching good call succeeds.
 *
 * usage: bad_args PACK NOT_A_PACK
 * Prints "ok N checks" and exits 0, or prints the first failed check and exits 1.
 */
#include "xdna_vl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks;

/* The call returned `want` and the thread's message contains `needle`. */
static void expect_at(int line, const char *call, xvl_status got, xvl_status want, const char *needle) {
    checks++;
    const char *msg = xvl_last_error();
    if (got != want || (needle && !strstr(msg, needle))) {
        printf("FAIL line %d: %s\n  returned %s (want %s)\n  message: %s\n  (want it to contain: %s)\n",
               line, call, xvl_status_name(got), xvl_status_name(want), msg, needle ? needle : "-");
        exit(1);
    }
}
#define EXPECT(call, want, needle) expect_at(__LINE__, #call, (call), (want), (needle))

static void expect_true(int line, const char *what, int ok) {
    checks++;
    if (!ok) {
        printf("FAIL line %d: %s (last error: %s)\n", line, what, xvl_last_error());
        exit(1);
    }
}
#define EXPECT_TRUE(cond) expect_true(__LINE__, #cond, (cond))

/* Another thread's failure must not change this thread's message. */
static void *fail_on_another_thread(void *arg) {
    (void)arg;
    size_t out;
    xvl_status s = xvl_vocab_size(NULL, &out);
    return (void *)(s == XVL_ERR_NULL && strstr(xvl_last_error(), "xvl_vocab_size") ? "ok" : NULL);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: bad_args PACK NOT_A_PACK\n");
        return 2;
    }
    const char *pack = argv[1], *not_a_pack = argv[2];

    /* ---- names and messages ---- */
    EXPECT_TRUE(strcmp(xvl_status_name(XVL_ERR_SLOT), "XVL_ERR_SLOT") == 0);
    EXPECT_TRUE(strcmp(xvl_status_name(XVL_OK), "XVL_OK") == 0);
    EXPECT_TRUE(strcmp(xvl_status_name(99), "XVL_UNKNOWN_STATUS") == 0);
    EXPECT_TRUE(strcmp(xvl_last_error(), "") == 0);

    /* ---- open ---- */
    xvl_open_options opts;
    EXPECT(xvl_open_options_init(NULL), XVL_ERR_NULL, "`options` is NULL");
    EXPECT(xvl_open_options_init(&opts), XVL_OK, NULL);
    EXPECT_TRUE(opts.struct_size == sizeof(xvl_open_options) && opts.gemm == XVL_GEMM_HOST &&
                opts.capacity == 2048 && opts.threads == 0 && opts.kv_dtype == XVL_KV_F32 &&
                opts.runtime_path == NULL && opts.designs_dir == NULL);
    opts.capacity = 8;
    opts.threads = 1;

    xvl_forward *f = (xvl_forward *)&opts; /* garbage that xvl_open must overwrite */
    EXPECT(xvl_open(NULL, &opts, &f), XVL_ERR_NULL, "xvl_open: `pack_path` is NULL");
    EXPECT_TRUE(f == NULL);
    EXPECT(xvl_open(pack, NULL, &f), XVL_ERR_NULL, "`options` is NULL");
    EXPECT(xvl_open(pack, &opts, NULL), XVL_ERR_NULL, "`out` is NULL");
    EXPECT(xvl_open("", &opts, &f), XVL_ERR_ARGUMENT, "empty path");

    xvl_open_options bad = opts;
    bad.struct_size = 12;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_ARGUMENT, "options.struct_size = 12");
    bad = opts;
    bad.gemm = 7;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_ARGUMENT, "options.gemm = 7");
    bad = opts;
    bad.kv_dtype = 9;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_ARGUMENT, "options.kv_dtype = 9");
    bad = opts;
    bad.capacity = 0;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_ARGUMENT, "capacity must be at least 1");
    bad = opts;
    bad.gemm = XVL_GEMM_DEVICE;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_NULL, "`options.designs_dir` is NULL; XVL_GEMM_DEVICE needs");
    EXPECT_TRUE(f == NULL);
    bad.gemm = XVL_GEMM_AB;
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_NULL, "XVL_GEMM_AB needs a designs directory");
    bad.runtime_path = "/nonexistent/libruntime.so";
    bad.designs_dir = "/nowhere/designs";
    EXPECT(xvl_open(pack, &bad, &f), XVL_ERR_BACKEND, "/nowhere/designs");
    EXPECT_TRUE(f == NULL);
    EXPECT(xvl_open("/nonexistent/x.pack", &opts, &f), XVL_ERR_PACK, "/nonexistent/x.pack");
    EXPECT(xvl_open(not_a_pack, &opts, &f), XVL_ERR_PACK, not_a_pack);
    EXPECT_TRUE(f == NULL);

    /* Control: the good open. */
    EXPECT(xvl_open(pack, &opts, &f), XVL_OK, NULL);
    EXPECT_TRUE(f != NULL);
    size_t hidden = 0, vocab = 0, sets = 0, slot = 99, cap = 0;
    EXPECT(xvl_hidden_size(f, &hidden), XVL_OK, NULL);
    EXPECT(xvl_vocab_size(f, &vocab), XVL_OK, NULL);
    EXPECT(xvl_deepstack_sets(f, &sets), XVL_OK, NULL);
    EXPECT(xvl_capacity(f, &cap), XVL_OK, NULL);
    EXPECT_TRUE(hidden > 0 && vocab > 0 && sets > 0 && cap == 8);

    /* ---- getters ---- */
    EXPECT(xvl_hidden_size(NULL, &hidden), XVL_ERR_NULL, "xvl_hidden_size: `f` is NULL");
    EXPECT(xvl_kv_bytes(f, NULL), XVL_ERR_NULL, "xvl_kv_bytes: `out` is NULL");
    EXPECT(xvl_next_slot(NULL, &slot), XVL_ERR_NULL, "`f` is NULL");
    EXPECT(xvl_reset(NULL), XVL_ERR_NULL, "xvl_reset: `f` is NULL");
    EXPECT(xvl_truncate(NULL, 0), XVL_ERR_NULL, "xvl_truncate: `f` is NULL");
    xvl_ab_stats report;
    EXPECT(xvl_ab_report(f, &report), XVL_ERR_ARGUMENT, "GEMM backend is `host`; only XVL_GEMM_AB");
    EXPECT(xvl_ab_report(f, NULL), XVL_ERR_ARGUMENT, "only XVL_GEMM_AB");
    EXPECT(xvl_ab_report(NULL, &report), XVL_ERR_NULL, "xvl_ab_report: `f` is NULL");

    /* A handle-shaped pointer that is not a handle. */
    static uint64_t not_a_handle[16];
    EXPECT(xvl_next_slot((const xvl_forward *)not_a_handle, &slot), XVL_ERR_ARGUMENT,
           "not an open xvl_forward handle");

    float *logits = calloc(4 * vocab + 1, sizeof(float));
    float *embeds = calloc(4 * hidden + 1, sizeof(float));
    if (!logits || !embeds) return 2;

    /* ---- xvl_embed_row ---- */
    EXPECT(xvl_embed_row(NULL, 3, embeds, hidden), XVL_ERR_NULL, "`f` is NULL");
    EXPECT(xvl_embed_row(f, 3, NULL, hidden), XVL_ERR_NULL, "`out` is NULL");
    EXPECT(xvl_embed_row(f, 3, embeds, hidden - 1), XVL_ERR_BUFFER, "the call writes");
    EXPECT(xvl_embed_row(f, (uint32_t)vocab, embeds, hidden), XVL_ERR_TOKEN, "outside the vocabulary");
    EXPECT(xvl_embed_row(f, 3, (float *)((char *)embeds + 1), hidden), XVL_ERR_ARGUMENT, "not aligned");

    /* ---- xvl_step ---- */
    EXPECT(xvl_step(NULL, 3, 0, 0, logits, vocab), XVL_ERR_NULL, "xvl_step: `f` is NULL");
    EXPECT(xvl_step(f, 3, 0, 0, NULL, vocab), XVL_ERR_NULL, "`logits` is NULL");
    char expect_short[128];
    snprintf(expect_short, sizeof expect_short, "`logits` holds %zu values, the call writes %zu", vocab - 1,
             vocab);
    EXPECT(xvl_step(f, 3, 0, 0, logits, vocab - 1), XVL_ERR_BUFFER, expect_short);
    EXPECT(xvl_step(f, 3, 0, 1, logits, vocab), XVL_ERR_SLOT, "cache slot 1 refused: the next free slot is 0");
    EXPECT(xvl_step(f, (uint32_t)vocab, 0, 0, logits, vocab), XVL_ERR_TOKEN, "outside the vocabulary");
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, NULL);
    EXPECT_TRUE(slot == 0);
    EXPECT_TRUE(logits[0] == 0.0f); /* nothing written by the refusals */

    /* ---- xvl_step_batch ---- */
    const uint32_t tokens[9] = {3, 17, 99, 4, 5, 6, 7, 8, 9};
    EXPECT(xvl_step_batch(f, NULL, 3, 0, 0, XVL_LOGITS_LAST_ROW, logits, vocab), XVL_ERR_NULL, "`tokens` is NULL");
    EXPECT(xvl_step_batch(f, tokens, 0, 0, 0, XVL_LOGITS_LAST_ROW, logits, vocab), XVL_ERR_ARGUMENT,
           "n_tokens is 0");
    EXPECT(xvl_step_batch(f, tokens, 3, 0, 0, 5, logits, vocab), XVL_ERR_ARGUMENT, "which = 5");
    EXPECT(xvl_step_batch(f, tokens, 3, 0, 0, XVL_LOGITS_ALL_ROWS, logits, 2 * vocab), XVL_ERR_BUFFER,
           "the call writes");
    EXPECT(xvl_step_batch(f, tokens, 9, 0, 0, XVL_LOGITS_LAST_ROW, logits, vocab), XVL_ERR_CAPACITY,
           "the KV cache holds 8");

    /* ---- xvl_step_batch_embeds ---- */
    const size_t rows = 2;
    for (size_t r = 0; r < rows; r++) EXPECT(xvl_embed_row(f, tokens[r], embeds + r * hidden, hidden), XVL_OK, NULL);
    const int64_t planes[6] = {0, 1, 0, 1, 0, 1};
    const size_t image_rows[2] = {1, 0};
    float *deepstack = calloc(sets * rows * hidden, sizeof(float));
    if (!deepstack) return 2;
    const xvl_hybrid good = {planes, 3 * rows, 0, NULL, 0, NULL, 0, 0};
    xvl_hybrid h = good;
    EXPECT(xvl_step_batch_embeds(NULL, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_NULL, "`f` is NULL");
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, NULL, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_NULL, "`hybrid` is NULL");
    EXPECT(xvl_step_batch_embeds(f, NULL, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_NULL, "`embeds` is NULL");
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden - 1, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_INPUTS, "not a positive multiple of hidden size");
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_ALL_ROWS, logits, 2 * vocab - 1),
           XVL_ERR_BUFFER, "the call writes");
    h.planes_len = 3 * rows - 1; /* wrong plane count */
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_INPUTS, "5 position values given, expected 3 planes x 2 rows = 6");
    h = good;
    h.planes = NULL; /* a length without a buffer */
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_NULL, "`hybrid.planes` is NULL");
    h = good;
    h.image_rows = image_rows; /* descending */
    h.image_rows_len = 2;
    h.deepstack = deepstack;
    h.deepstack_len = sets * 2 * hidden;
    h.deepstack_sets = sets;
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_INPUTS, "strictly ascending");
    h.image_rows = image_rows + 1; /* row 0 only */
    h.image_rows_len = 1;
    h.deepstack_len = sets * 2 * hidden; /* two rows' worth for one image row */
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_INPUTS, "one row per image row");
    h.deepstack_len = (sets + 1) * hidden;
    h.deepstack_sets = sets + 1;
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_INPUTS, "the pack declares");
    h.deepstack = NULL;
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &h, 0, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_NULL, "`hybrid.deepstack` is NULL");
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &good, 1, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_SLOT, "cache slot 1 refused");
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, NULL);
    EXPECT_TRUE(slot == 0);
    EXPECT_TRUE(logits[0] == 0.0f);

    /* The thread-local message: a success leaves it, another thread's failure does not touch it. */
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &good, 1, XVL_LOGITS_LAST_ROW, logits, vocab),
           XVL_ERR_SLOT, "xvl_step_batch_embeds: cache slot 1");
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, "xvl_step_batch_embeds: cache slot 1");
    pthread_t t;
    void *thread_ok = NULL;
    EXPECT_TRUE(pthread_create(&t, NULL, fail_on_another_thread, NULL) == 0);
    EXPECT_TRUE(pthread_join(t, &thread_ok) == 0 && thread_ok != NULL);
    EXPECT_TRUE(strstr(xvl_last_error(), "xvl_step_batch_embeds: cache slot 1") != NULL);

    /* Controls: the good calls succeed and move the slot. */
    EXPECT(xvl_step_batch_embeds(f, embeds, rows * hidden, &good, 0, XVL_LOGITS_ALL_ROWS, logits, 2 * vocab),
           XVL_OK, NULL);
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, NULL);
    EXPECT_TRUE(slot == 2 && logits[0] != 0.0f && logits[2 * vocab - 1] != 0.0f && logits[2 * vocab] == 0.0f);
    EXPECT(xvl_step(f, 3, 2, 2, logits, vocab), XVL_OK, NULL);
    EXPECT(xvl_step(f, 3, 3, 2, logits, vocab), XVL_ERR_SLOT, "the next free slot is 3");
    EXPECT(xvl_truncate(f, 1), XVL_OK, NULL);
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, NULL);
    EXPECT_TRUE(slot == 1);
    EXPECT(xvl_reset(f), XVL_OK, NULL);
    EXPECT(xvl_next_slot(f, &slot), XVL_OK, NULL);
    EXPECT_TRUE(slot == 0);
    EXPECT(xvl_step_batch(f, tokens, 8, 0, 0, XVL_LOGITS_LAST_ROW, logits, vocab), XVL_OK, NULL);
    EXPECT(xvl_step(f, 3, 8, 8, logits, vocab), XVL_ERR_CAPACITY, "the KV cache holds 8");

    xvl_close(f);
    xvl_close(NULL);
    free(logits);
    free(embeds);
    free(deepstack);
    printf("ok %d checks\n", checks);
    return 0;
}
