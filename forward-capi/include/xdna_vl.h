/*
 * xdna_vl.h — C ABI of the xdna-vl Qwen3-VL text decoder (libxdna_vl.so / libxdna_vl.a).
 *
 * Written by hand; forward-capi/tests/header.rs checks it against the library: every function here
 * is exported and every exported xvl_ function is here, with the same parameter types as the Rust
 * definitions, the same #define values, and the same struct sizes and field offsets.
 *
 * The calls mean what the Rust `forward` API means:
 *   - A cache slot (where a row's K/V are written) and a rotary position (the angle it is rotated
 *     by) are separate numbers. A step must start at the next free slot (xvl_next_slot); after an
 *     image the rotary position runs behind the slot.
 *   - Position planes are plane-major: t of every row, then h of every row, then w (3 x rows).
 *   - DeepStack set l (of xvl_deepstack_sets) is added to the image rows after decoder layer l,
 *     row i of the set to the i-th image row in prompt order.
 *
 * Errors. Every function that can fail returns an xvl_status: XVL_OK (0) or an XVL_ERR_* code, and
 * then xvl_last_error() describes the failure. The message is THREAD-LOCAL (errno-style): it is the
 * message of the most recent failing call made by the calling thread, whatever handle it was on;
 * successful calls leave it unchanged. A refused call changes nothing: no slot is filled, no output
 * is written (except xvl_open, which sets *out = NULL).
 *
 * Pointers. Every buffer is a (pointer, element count) pair. NULL with a nonzero count, a count
 * shorter than the call needs, or a misaligned pointer is refused with a status code; NULL is allowed
 * wherever the count is 0. What cannot be checked stays the caller's contract: a pointer must point to
 * at least as many elements as its count says, an output buffer must not overlap an input, and a
 * handle must come from xvl_open and not have been closed (a closed handle is refused on a best-effort
 * basis only).
 *
 * Thread safety. A handle may be used from any thread. Calls on one handle are serialized by a lock
 * inside it (a second thread blocks until the first call returns); different handles run in
 * parallel. xvl_close must not race any other call on the same handle. Each handle owns a thread
 * pool of `threads` workers for its GEMMs and attention.
 *
 * Panics. A Rust panic inside the library never unwinds into C: the call returns XVL_ERR_PANIC and
 * the handle refuses every later call with XVL_ERR_PANIC (close it).
 */
#ifndef XDNA_VL_H
#define XDNA_VL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------------------------------- */

typedef int32_t xvl_status;

#define XVL_OK 0
#define XVL_ERR_NULL 1        /* a required pointer (handle, buffer, out parameter, path) is NULL */
#define XVL_ERR_BUFFER 2      /* an output buffer is shorter than the call writes */
#define XVL_ERR_ARGUMENT 3    /* a bad value: unknown enum, options.struct_size, misaligned pointer */
#define XVL_ERR_PACK 4        /* the pack cannot be opened or read */
#define XVL_ERR_SLOT 5        /* the cache slot is not the next free one */
#define XVL_ERR_CAPACITY 6    /* the rows do not fit in the KV cache */
#define XVL_ERR_TOKEN 7       /* a token id is outside the vocabulary */
#define XVL_ERR_INPUTS 8      /* row embeddings, planes, image rows or DeepStack sets refused */
#define XVL_ERR_BACKEND 9     /* the GEMM backend failed (device: runtime, designs, launch) */
#define XVL_ERR_PANIC 10      /* a panic was caught inside; the handle is unusable */
#define XVL_ERR_IMAGE 11      /* a chat picture cannot be read, decoded or encoded */
#define XVL_ERR_CHAT 12       /* no tokenizer / chat template in the pack, or the chat cannot be rendered */

/* ---- option values --------------------------------------------------------------------------- */

#define XVL_GEMM_HOST 0   /* GEMMs on the CPU */
#define XVL_GEMM_DEVICE 1 /* GEMMs on the NPU runtime (i8 and q4 packs; needs designs_dir) */
#define XVL_GEMM_AB 2     /* host and device GEMM by GEMM, the host's result used (xvl_ab_report) */

#define XVL_KV_F32 0  /* KV cache in f32 */
#define XVL_KV_BF16 1 /* KV cache in bf16: half the bytes */

#define XVL_LOGITS_LAST_ROW 0 /* a step writes vocab floats: the last row's logits */
#define XVL_LOGITS_ALL_ROWS 1 /* a step writes rows x vocab floats, row-major */

#define XVL_ROLE_SYSTEM 0    /* xvl_message.role */
#define XVL_ROLE_USER 1      /* the only role that can show pictures */
#define XVL_ROLE_ASSISTANT 2

/* ---- types ----------------------------------------------------------------------------------- */

/* An open pack and its decoder: KV cache, thread pool, scratch. Opaque. */
typedef struct xvl_forward xvl_forward;

/* How xvl_open builds a forward. Fill it with xvl_open_options_init, then change fields. */
typedef struct xvl_open_options {
    uint32_t struct_size;     /* sizeof(xvl_open_options); set by xvl_open_options_init */
    uint32_t gemm;            /* XVL_GEMM_*; default XVL_GEMM_HOST */
    size_t capacity;          /* KV cache slots (longest prompt + generation); default 2048 */
    uint32_t threads;         /* worker threads; 0 (default) = one per available core */
    uint32_t kv_dtype;        /* XVL_KV_*; default XVL_KV_F32 */
    const char *runtime_path; /* device/ab: the NPU runtime library; NULL = $XDNA_VL_RUNTIME, */
                              /*   then the installed XRT shim (libxdna_vl_xrt.so) */
    const char *designs_dir;  /* device/ab: designs directory with its manifest.json; required */
} xvl_open_options;

/* What xvl_step_batch_embeds needs beside the row embeddings. */
typedef struct xvl_hybrid {
    const int64_t *planes;    /* 3 x rows positions, plane-major (t..., h..., w...); NULL with */
    size_t planes_len;        /*   planes_len 0 = plain positions start_pos + i on all planes */
    int64_t start_pos;        /* rotary position of row 0 when planes is NULL */
    const size_t *image_rows; /* prompt rows that are image rows, strictly ascending */
    size_t image_rows_len;
    const float *deepstack;   /* deepstack_sets x image_rows_len x hidden floats */
    size_t deepstack_len;
    size_t deepstack_sets;    /* the pack's count (xvl_deepstack_sets) when there are image rows */
} xvl_hybrid;

/* How host and device compared so far on a handle opened with XVL_GEMM_AB. */
typedef struct xvl_ab_stats {
    uint64_t gemms;            /* GEMMs compared */
    uint64_t differing_gemms;  /* GEMMs with at least one differing value */
    uint64_t differing_values; /* values that differ at all (bitwise) */
    float max_abs_diff;
} xvl_ab_stats;

/* ---- library --------------------------------------------------------------------------------- */

/* The library version ("0.1.0"); a static string. */
const char *xvl_version(void);

/* The name of a status code ("XVL_ERR_SLOT"); a static string. */
const char *xvl_status_name(xvl_status status);

/* The calling thread's last failure message ("" if none). Valid until the next failing call on
 * this thread; copy it to keep it. */
const char *xvl_last_error(void);

/* ---- open / close ---------------------------------------------------------------------------- */

/* Fills *options with the defaults (host GEMM, 2048 slots, all cores, f32 KV cache). */
xvl_status xvl_open_options_init(xvl_open_options *options);

/* Opens the pack file at pack_path and builds a forward over it. On success *out is the new handle;
 * on failure *out is NULL. With XVL_GEMM_DEVICE or XVL_GEMM_AB the runtime is opened and every weight
 * uploaded here: a missing runtime or design, or an unquantized pack, is XVL_ERR_BACKEND. */
xvl_status xvl_open(const char *pack_path, const xvl_open_options *options, xvl_forward **out);

/* Frees a handle and its KV cache. NULL is ignored. */
void xvl_close(xvl_forward *f);

/* ---- facts ----------------------------------------------------------------------------------- */

xvl_status xvl_hidden_size(const xvl_forward *f, size_t *out);    /* row embedding width */
xvl_status xvl_vocab_size(const xvl_forward *f, size_t *out);     /* logits per row */
xvl_status xvl_deepstack_sets(const xvl_forward *f, size_t *out); /* DeepStack sets of the pack */
xvl_status xvl_capacity(const xvl_forward *f, size_t *out);       /* KV cache slots */
xvl_status xvl_kv_bytes(const xvl_forward *f, size_t *out);       /* bytes the KV cache holds */
xvl_status xvl_next_slot(const xvl_forward *f, size_t *out);      /* filled slots = next start */

/* The host/device comparison so far; XVL_ERR_ARGUMENT unless the handle was opened with XVL_GEMM_AB. */
xvl_status xvl_ab_report(const xvl_forward *f, xvl_ab_stats *out);

/* ---- cache ----------------------------------------------------------------------------------- */

/* Forgets every slot: the next step starts at slot 0. */
xvl_status xvl_reset(xvl_forward *f);

/* Forgets slots len.. : the next step starts at min(len, xvl_next_slot). A Qwen3.5 pack's
 * recurrent state goes back only to a row of the last step; elsewhere every slot is forgotten:
 * read xvl_next_slot after a cut. */
xvl_status xvl_truncate(xvl_forward *f, size_t len);

/* ---- steps ----------------------------------------------------------------------------------- */

/* The embedding row of token (hidden floats) into out[0..hidden). For building xvl_step_batch_embeds
 * rows: text rows take their token's embedding, image rows the vision encoder's output. */
xvl_status xvl_embed_row(const xvl_forward *f, uint32_t token, float *out, size_t out_len);

/* One token at rotary position rotary_pos (all three planes), its K/V written to cache_slot (which
 * must be xvl_next_slot). Writes vocab floats to logits (logits_len >= vocab). */
xvl_status xvl_step(xvl_forward *f, uint32_t token, int64_t rotary_pos, size_t cache_slot,
                    float *logits, size_t logits_len);

/* A text prompt of n_tokens >= 1 tokens: row i at rotary position start_pos + i, cache slot
 * start_slot + i. `which` is XVL_LOGITS_LAST_ROW (vocab floats) or XVL_LOGITS_ALL_ROWS
 * (n_tokens x vocab floats). */
xvl_status xvl_step_batch(xvl_forward *f, const uint32_t *tokens, size_t n_tokens,
                          int64_t start_pos, size_t start_slot, uint32_t which, float *logits,
                          size_t logits_len);

/* Rows given as embeddings: embeds holds rows x hidden floats (embeds_len = rows * hidden), row i
 * written to cache slot start_slot + i and rotated by its planes in *hybrid. `which` as in
 * xvl_step_batch (rows x vocab floats for XVL_LOGITS_ALL_ROWS). */
xvl_status xvl_step_batch_embeds(xvl_forward *f, const float *embeds, size_t embeds_len,
                                 const xvl_hybrid *hybrid, size_t start_slot, uint32_t which,
                                 float *logits, size_t logits_len);

/* ---- chat: messages in, text out ------------------------------------------------------------ */
/*
 * The whole model behind one handle: the pack's tokenizer and chat template, its vision tower and
 * decoder, sampling and streaming — the engine every xdna-vl front end uses. A chat handle keeps its
 * KV cache between runs: a conversation that starts like the previous run's prompt (same ids, same
 * pictures) reuses those rows instead of prefilling them again. Thread safety, panics and the last
 * error are as for xvl_forward.
 */

/* An open pack as a chat session. Opaque. */
typedef struct xvl_chat xvl_chat;

/* One turn of the conversation. */
typedef struct xvl_message {
    uint32_t role;                   /* XVL_ROLE_* */
    const char *text;                /* UTF-8, NUL-terminated; required ("" is allowed) */
    const char *const *image_paths;  /* pictures (PNG, JPEG, WebP, GIF) shown before the text; */
    size_t image_paths_len;          /*   user turns only; NULL with 0 = none */
} xvl_message;

/* How each answer token is chosen. Fill it with xvl_sampling_init, then change fields. */
typedef struct xvl_sampling {
    uint32_t struct_size; /* sizeof(xvl_sampling); set by xvl_sampling_init */
    float temperature;    /* 0 (default) = greedy */
    uint32_t top_k;       /* 0 (default) = off */
    float top_p;          /* in (0, 1]; 1 (default) = off */
    uint64_t seed;        /* the same seed gives the same answer; default 0 */
    size_t max_tokens;    /* at least 1; default 256 */
} xvl_sampling;

/* Receives each piece of the answer as it is produced: len bytes of UTF-8 (whole characters, never
 * half of one), followed by a NUL. Return 0 to go on; anything else ends the answer there (the run
 * still succeeds, with the text so far). */
typedef int32_t (*xvl_text_callback)(const char *piece, size_t len, void *user_data);

/* Fills *sampling with the defaults (greedy, 256 tokens at most, seed 0). */
xvl_status xvl_sampling_init(xvl_sampling *sampling);

/* Opens the pack at pack_path as a chat (the pack must carry its tokenizer and chat template:
 * `packs build` stores them; XVL_ERR_CHAT otherwise). options as for xvl_open; options->capacity is
 * the context: prompt + answer tokens. On failure *out is NULL. */
xvl_status xvl_chat_open(const char *pack_path, const xvl_open_options *options, xvl_chat **out);

/* Frees a chat handle. NULL is ignored. */
void xvl_chat_close(xvl_chat *chat);

/* Answers the conversation messages[0..messages_len) (ending with a user turn) with the checkpoint's
 * chat template, add_generation_prompt on. sampling NULL = the defaults. Every picture is read
 * before anything runs: a missing or unreadable one is XVL_ERR_IMAGE with its path and
 * messages[i].image_paths[j] in the message. A prompt longer than the context is XVL_ERR_CAPACITY.
 *
 * Out: on_text (NULL = none) gets each piece as produced. *text_needed (NULL = not wanted) gets the
 * answer's size in bytes with its NUL; text (NULL with text_len 0 = not wanted) gets the answer,
 * NUL-terminated. If text_len is smaller than that, the call returns XVL_ERR_BUFFER and writes
 * nothing to text (but *text_needed and the callback's pieces are written): run the same
 * messages again with a larger buffer — the same sampling gives the same answer, and the prompt's
 * rows come from the cache. */
xvl_status xvl_chat_run(xvl_chat *chat, const xvl_message *messages, size_t messages_len,
                        const xvl_sampling *sampling, xvl_text_callback on_text, void *user_data,
                        char *text, size_t text_len, size_t *text_needed);

#ifdef __cplusplus
}
#endif

#endif /* XDNA_VL_H */
