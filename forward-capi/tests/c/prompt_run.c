/*
 * A C engine's run of one prompt through libxdna_vl, the way the probes run it: prefill the
 * prompt's rows as embeddings (text rows from xvl_embed_row, image rows from the vision encoder's
 * output) with their position planes, image rows and DeepStack sets; then greedy steps, each token at
 * cache slot rows + i and rotary position max(planes) + 1 + i; then the greedy ids again as a text
 * batch.
 *
 * usage: prompt_run PACK PROMPT_BIN LOGITS_OUT THREADS KV(f32|bf16) GEMM(host|device|ab) [RUNTIME DESIGNS]
 *
 * PROMPT_BIN (little-endian, written by the Rust test):
 *   char magic[8] = "XVLPRMT1"
 *   u64 rows, image_rows, sets, hidden; i64 image_token_id; u64 greedy_steps, capacity
 *   i64 ids[rows]; i64 planes[3 * rows]  (plane-major: t..., h..., w...)
 *   f32 image_embeds[image_rows * hidden]; f32 deepstack[sets * image_rows * hidden]
 *
 * LOGITS_OUT gets every logit the run produced, as raw f32: the prefill's rows x vocab, then each
 * greedy step's vocab, then the text batch's rows x vocab. stdout gets FNV-1a 64 checksums of those
 * bytes, the greedy ids, the cache facts and (ab) the host/device comparison; the Rust test compares
 * both with the Rust API's run.
 */
#include "xdna_vl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        xvl_status s_ = (call);                                                                  \
        if (s_ != XVL_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,                 \
                    xvl_status_name(s_), xvl_last_error());                                      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static void die(const char *what) {
    fprintf(stderr, "prompt_run: %s\n", what);
    exit(2);
}

static void *read_exact(FILE *f, size_t count, size_t size) {
    void *p = malloc(count * size + 1);
    if (!p) die("out of memory");
    if (count && fread(p, size, count, f) != count) die("prompt file is short");
    return p;
}

static uint64_t read_u64(FILE *f) {
    uint64_t v;
    if (fread(&v, sizeof v, 1, f) != 1) die("prompt file is short");
    return v;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *b = data;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_START 0xcbf29ce484222325ULL

/* The first largest logit, as torch.argmax. */
static uint32_t argmax(const float *v, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return (uint32_t)best;
}

static FILE *out_file;
static uint64_t all_sum = FNV_START;

static uint64_t emit(const float *logits, size_t n) {
    if (fwrite(logits, sizeof(float), n, out_file) != n) die("cannot write the logits");
    all_sum = fnv1a(all_sum, logits, n * sizeof(float));
    return fnv1a(FNV_START, logits, n * sizeof(float));
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 9)
        die("usage: prompt_run PACK PROMPT_BIN LOGITS_OUT THREADS KV(f32|bf16) GEMM(host|device|ab) [RUNTIME DESIGNS]");
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) die("the prompt file is little-endian; this host is not");

    FILE *pf = fopen(argv[2], "rb");
    if (!pf) die("cannot open the prompt file");
    char magic[8];
    if (fread(magic, 1, 8, pf) != 8 || memcmp(magic, "XVLPRMT1", 8) != 0) die("bad prompt magic");
    size_t rows = read_u64(pf), n_img = read_u64(pf), sets = read_u64(pf), file_hidden = read_u64(pf);
    int64_t image_token_id = (int64_t)read_u64(pf);
    size_t greedy_steps = read_u64(pf), capacity = read_u64(pf);
    int64_t *ids = read_exact(pf, rows, sizeof(int64_t));
    int64_t *planes = read_exact(pf, 3 * rows, sizeof(int64_t));
    float *image_embeds = read_exact(pf, n_img * file_hidden, sizeof(float));
    float *deepstack = read_exact(pf, sets * n_img * file_hidden, sizeof(float));
    fclose(pf);

    xvl_open_options opts;
    CHECK(xvl_open_options_init(&opts));
    opts.capacity = capacity;
    opts.threads = (uint32_t)atoi(argv[4]);
    opts.kv_dtype = strcmp(argv[5], "bf16") == 0 ? XVL_KV_BF16 : XVL_KV_F32;
    const int ab = strcmp(argv[6], "ab") == 0;
    opts.gemm = ab ? XVL_GEMM_AB : strcmp(argv[6], "device") == 0 ? XVL_GEMM_DEVICE : XVL_GEMM_HOST;
    if (argc == 9) {
        opts.runtime_path = argv[7];
        opts.designs_dir = argv[8];
    }
    xvl_forward *f = NULL;
    CHECK(xvl_open(argv[1], &opts, &f));

    size_t hidden, vocab, pack_sets;
    CHECK(xvl_hidden_size(f, &hidden));
    CHECK(xvl_vocab_size(f, &vocab));
    CHECK(xvl_deepstack_sets(f, &pack_sets));
    if (hidden != file_hidden) die("the prompt's hidden size differs from the pack's");

    /* Row embeddings: the token's embedding for text rows, the next image embedding for image rows. */
    float *embeds = malloc(rows * hidden * sizeof(float));
    size_t *image_rows = malloc((n_img + 1) * sizeof(size_t));
    if (!embeds || !image_rows) die("out of memory");
    size_t img = 0;
    for (size_t r = 0; r < rows; r++) {
        if (ids[r] == image_token_id) {
            if (img == n_img) die("more image tokens than image rows");
            memcpy(embeds + r * hidden, image_embeds + img * hidden, hidden * sizeof(float));
            image_rows[img++] = r;
        } else {
            CHECK(xvl_embed_row(f, (uint32_t)ids[r], embeds + r * hidden, hidden));
        }
    }
    if (img != n_img) die("fewer image tokens than image rows");

    xvl_hybrid hybrid = {
        .planes = planes,
        .planes_len = 3 * rows,
        .start_pos = 0,
        .image_rows = image_rows,
        .image_rows_len = n_img,
        .deepstack = deepstack,
        .deepstack_len = sets * n_img * hidden,
        .deepstack_sets = sets,
    };
    out_file = fopen(argv[3], "wb");
    if (!out_file) die("cannot create the logits file");

    size_t max_rows = rows > greedy_steps + 1 ? rows : greedy_steps + 1;
    float *logits = malloc(max_rows * vocab * sizeof(float));
    if (!logits) die("out of memory");
    CHECK(xvl_step_batch_embeds(f, embeds, rows * hidden, &hybrid, 0, XVL_LOGITS_ALL_ROWS, logits,
                                rows * vocab));
    printf("prefill rows=%zu fnv1a64=%016" PRIx64 "\n", rows, emit(logits, rows * vocab));

    int64_t next_pos = planes[0];
    for (size_t i = 0; i < 3 * rows; i++)
        if (planes[i] > next_pos) next_pos = planes[i];
    next_pos += 1;

    uint32_t *greedy = malloc((greedy_steps + 1) * sizeof(uint32_t));
    if (!greedy) die("out of memory");
    greedy[0] = argmax(logits + (rows - 1) * vocab, vocab);
    uint64_t steps_sum = FNV_START;
    for (size_t i = 0; i < greedy_steps; i++) {
        CHECK(xvl_step(f, greedy[i], next_pos + (int64_t)i, rows + i, logits, vocab));
        emit(logits, vocab);
        steps_sum = fnv1a(steps_sum, logits, vocab * sizeof(float));
        greedy[i + 1] = argmax(logits, vocab);
    }
    printf("steps n=%zu fnv1a64=%016" PRIx64 "\n", greedy_steps, steps_sum);
    printf("ids");
    for (size_t i = 0; i <= greedy_steps; i++) printf(" %" PRIu32, greedy[i]);
    printf("\n");

    size_t next_slot, kv_bytes, cap;
    CHECK(xvl_next_slot(f, &next_slot));
    CHECK(xvl_kv_bytes(f, &kv_bytes));
    CHECK(xvl_capacity(f, &cap));
    printf("next_slot=%zu capacity=%zu kv_bytes=%zu hidden=%zu vocab=%zu deepstack_sets=%zu\n",
           next_slot, cap, kv_bytes, hidden, vocab, pack_sets);

    /* The greedy ids again, as a text batch from slot 0. */
    CHECK(xvl_reset(f));
    CHECK(xvl_step_batch(f, greedy, greedy_steps + 1, 0, 0, XVL_LOGITS_ALL_ROWS, logits,
                         (greedy_steps + 1) * vocab));
    printf("text rows=%zu fnv1a64=%016" PRIx64 "\n", greedy_steps + 1,
           emit(logits, (greedy_steps + 1) * vocab));
    if (ab) {
        xvl_ab_stats report;
        CHECK(xvl_ab_report(f, &report));
        uint32_t bits;
        memcpy(&bits, &report.max_abs_diff, sizeof bits);
        printf("ab gemms=%" PRIu64 " differing_gemms=%" PRIu64 " differing_values=%" PRIu64
               " max_abs_diff_bits=%08" PRIx32 "\n",
               report.gemms, report.differing_gemms, report.differing_values, bits);
    }
    printf("all fnv1a64=%016" PRIx64 "\n", all_sum);

    xvl_close(f);
    if (fclose(out_file) != 0) die("cannot write the logits file");
    free(ids);
    free(planes);
    free(image_embeds);
    free(deepstack);
    free(embeds);
    free(image_rows);
    free(logits);
    free(greedy);
    return 0;
}
