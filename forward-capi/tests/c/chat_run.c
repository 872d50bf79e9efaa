/*
 * The chat entry from C: open a pack as a chat, ask a question about pictures given by path, read
 * the answer through the callback and the caller's buffer; then bad arguments, each a status code
 * and a message naming what was wrong.
 *
 * usage: chat_run PACK QUESTION MISSING_PICTURE PICTURE...
 * Prints "needed N", "streamed <answer>", "answer <answer>", "stopped <first piece>", then
 * "ok N checks", and exits 0; or prints the first failed check and exits 1.
 */
#include "xdna_vl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks;

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

/* Collects the streamed pieces; stops after `stop_after` pieces when it is nonzero. */
typedef struct {
    char text[4096];
    size_t len;
    int pieces;
    int stop_after;
} collector;

static int32_t collect(const char *piece, size_t len, void *user_data) {
    collector *c = user_data;
    if (piece[len] != '\0' || c->len + len >= sizeof c->text) return 1;
    memcpy(c->text + c->len, piece, len);
    c->len += len;
    c->text[c->len] = '\0';
    c->pieces++;
    return c->stop_after && c->pieces >= c->stop_after;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: chat_run PACK QUESTION MISSING_PICTURE PICTURE...\n");
        return 2;
    }
    const char *pack = argv[1], *question = argv[2], *missing = argv[3];
    const char *const *pictures = (const char *const *)(argv + 4);
    size_t n_pictures = (size_t)(argc - 4);

    xvl_open_options options;
    EXPECT(xvl_open_options_init(&options), XVL_OK, NULL);
    options.capacity = 256;
    options.threads = 2;

    /* ---- open: bad arguments, then the good call ---- */
    xvl_chat *chat = (xvl_chat *)&options; /* must be overwritten with NULL on failure */
    EXPECT(xvl_chat_open(NULL, &options, &chat), XVL_ERR_NULL, "`pack_path` is NULL");
    EXPECT_TRUE(chat == NULL);
    EXPECT(xvl_chat_open(pack, NULL, &chat), XVL_ERR_NULL, "xvl_chat_open: `options` is NULL");
    EXPECT(xvl_chat_open(pack, &options, NULL), XVL_ERR_NULL, "`out` is NULL");
    EXPECT(xvl_chat_open(missing, &options, &chat), XVL_ERR_PACK, missing);
    EXPECT_TRUE(chat == NULL);
    xvl_open_options wrong_size = options;
    wrong_size.struct_size = 8;
    EXPECT(xvl_chat_open(pack, &wrong_size, &chat), XVL_ERR_ARGUMENT, "options.struct_size = 8");
    EXPECT(xvl_chat_open(pack, &options, &chat), XVL_OK, NULL);
    EXPECT_TRUE(chat != NULL);

    xvl_sampling sampling;
    EXPECT(xvl_sampling_init(NULL), XVL_ERR_NULL, "`sampling` is NULL");
    EXPECT(xvl_sampling_init(&sampling), XVL_OK, NULL);
    EXPECT_TRUE(sampling.temperature == 0.0f && sampling.top_k == 0 && sampling.top_p == 1.0f);
    sampling.max_tokens = 12;

    xvl_message message = {XVL_ROLE_USER, question, pictures, n_pictures};

    /* ---- the answer: its size, the streamed pieces, the buffer ---- */
    size_t needed = 0;
    collector streamed = {.len = 0};
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, collect, &streamed, NULL, 0, &needed), XVL_OK, NULL);
    printf("needed %zu\n", needed);
    printf("streamed %s\n", streamed.text);
    EXPECT_TRUE(needed == streamed.len + 1);

    /* A buffer one byte short: refused with the size, nothing written. */
    char small[4096];
    memset(small, 'x', sizeof small);
    size_t reported = 0;
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, NULL, NULL, small, needed - 1, &reported),
           XVL_ERR_BUFFER, "the answer needs");
    EXPECT_TRUE(reported == needed);
    EXPECT_TRUE(small[0] == 'x' && small[needed - 2] == 'x');

    char answer[4096];
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL), XVL_OK, NULL);
    printf("answer %s\n", answer);
    EXPECT_TRUE(strlen(answer) + 1 == needed && strcmp(answer, streamed.text) == 0);

    /* The callback asks to stop after its first piece: the answer is that piece. */
    collector first = {.len = 0, .stop_after = 1};
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, collect, &first, answer, sizeof answer, NULL), XVL_OK, NULL);
    printf("stopped %s\n", answer);
    EXPECT_TRUE(first.pieces == 1 && strcmp(answer, first.text) == 0);

    /* ---- bad arguments to the run ---- */
    EXPECT(xvl_chat_run(NULL, &message, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_NULL, "xvl_chat_run: `chat` is NULL");
    EXPECT(xvl_chat_run(chat, NULL, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_NULL, "`messages` is NULL");
    EXPECT(xvl_chat_run(chat, &message, 0, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_ARGUMENT, "`messages_len` is 0");
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, NULL, NULL, NULL, 16, NULL), XVL_ERR_NULL, "`text` is NULL");

    xvl_message no_text = {XVL_ROLE_USER, NULL, NULL, 0};
    EXPECT(xvl_chat_run(chat, &no_text, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_NULL, "`messages[0].text` is NULL");

    /* A missing picture is named with its place in the messages, and nothing runs. */
    const char *with_missing[2] = {pictures[0], missing};
    xvl_message missing_picture = {XVL_ROLE_USER, question, with_missing, 2};
    xvl_message turns[2] = {{XVL_ROLE_SYSTEM, "Be brief.", NULL, 0}, missing_picture};
    EXPECT(xvl_chat_run(chat, turns, 2, &sampling, NULL, NULL, answer, sizeof answer, NULL), XVL_ERR_IMAGE,
           "messages[1].image_paths[1]");
    EXPECT_TRUE(strstr(xvl_last_error(), missing) != NULL);
    const char *null_path[1] = {NULL};
    xvl_message null_picture = {XVL_ROLE_USER, question, null_path, 1};
    EXPECT(xvl_chat_run(chat, &null_picture, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_NULL, "`messages[0].image_paths[0]` is NULL");
    xvl_message counted_but_null = {XVL_ROLE_USER, question, NULL, 2};
    EXPECT(xvl_chat_run(chat, &counted_but_null, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_NULL, "`messages[0].image_paths` is NULL");
    xvl_message system_picture = {XVL_ROLE_SYSTEM, question, pictures, 1};
    EXPECT(xvl_chat_run(chat, &system_picture, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_ARGUMENT, "only a user message");
    xvl_message bad_role = {7, question, NULL, 0};
    EXPECT(xvl_chat_run(chat, &bad_role, 1, &sampling, NULL, NULL, answer, sizeof answer, NULL),
           XVL_ERR_ARGUMENT, "messages[0].role = 7");

    xvl_sampling bad = sampling;
    bad.struct_size = 4;
    EXPECT(xvl_chat_run(chat, &message, 1, &bad, NULL, NULL, answer, sizeof answer, NULL), XVL_ERR_ARGUMENT,
           "sampling.struct_size = 4");
    bad = sampling;
    bad.top_p = 0.0f;
    EXPECT(xvl_chat_run(chat, &message, 1, &bad, NULL, NULL, answer, sizeof answer, NULL), XVL_ERR_ARGUMENT,
           "top-p 0");
    bad = sampling;
    bad.max_tokens = 0;
    EXPECT(xvl_chat_run(chat, &message, 1, &bad, NULL, NULL, answer, sizeof answer, NULL), XVL_ERR_ARGUMENT,
           "max tokens");

    /* After every refusal the handle still answers the same (control for "nothing moved"). */
    char again[4096];
    EXPECT(xvl_chat_run(chat, &message, 1, &sampling, NULL, NULL, again, sizeof again, NULL), XVL_OK, NULL);
    EXPECT_TRUE(strcmp(again, streamed.text) == 0);

    /* Sampling with a seed: the same seed twice gives the same answer. */
    xvl_sampling sampled = sampling;
    sampled.temperature = 0.8f;
    sampled.top_k = 20;
    sampled.top_p = 0.9f;
    sampled.seed = 7;
    char s1[4096], s2[4096];
    EXPECT(xvl_chat_run(chat, &message, 1, &sampled, NULL, NULL, s1, sizeof s1, NULL), XVL_OK, NULL);
    EXPECT(xvl_chat_run(chat, &message, 1, &sampled, NULL, NULL, s2, sizeof s2, NULL), XVL_OK, NULL);
    EXPECT_TRUE(strcmp(s1, s2) == 0);

    xvl_chat_close(chat);
    xvl_chat_close(NULL);
    printf("ok %d checks\n", checks);
    return 0;
}
