/* Prints the header's struct sizes and field offsets as the C compiler lays them out, and takes the
 * address of every function the header declares (so a declared but missing symbol fails to link).
 * tests/header.rs compares the numbers with the Rust structs. */
#include "xdna_vl.h"

#include <stddef.h>
#include <stdio.h>

#define FIELD(type, field) printf(#type "." #field " %zu %zu\n", offsetof(type, field), sizeof(((type *)0)->field))

typedef void (*any_fn)(void);

int main(void) {
    printf("xvl_open_options %zu %zu\n", sizeof(xvl_open_options), _Alignof(xvl_open_options));
    FIELD(xvl_open_options, struct_size);
    FIELD(xvl_open_options, gemm);
    FIELD(xvl_open_options, capacity);
    FIELD(xvl_open_options, threads);
    FIELD(xvl_open_options, kv_dtype);
    FIELD(xvl_open_options, runtime_path);
    FIELD(xvl_open_options, designs_dir);
    printf("xvl_hybrid %zu %zu\n", sizeof(xvl_hybrid), _Alignof(xvl_hybrid));
    FIELD(xvl_hybrid, planes);
    FIELD(xvl_hybrid, planes_len);
    FIELD(xvl_hybrid, start_pos);
    FIELD(xvl_hybrid, image_rows);
    FIELD(xvl_hybrid, image_rows_len);
    FIELD(xvl_hybrid, deepstack);
    FIELD(xvl_hybrid, deepstack_len);
    FIELD(xvl_hybrid, deepstack_sets);
    printf("xvl_ab_stats %zu %zu\n", sizeof(xvl_ab_stats), _Alignof(xvl_ab_stats));
    FIELD(xvl_ab_stats, gemms);
    FIELD(xvl_ab_stats, differing_gemms);
    FIELD(xvl_ab_stats, differing_values);
    FIELD(xvl_ab_stats, max_abs_diff);
    printf("xvl_message %zu %zu\n", sizeof(xvl_message), _Alignof(xvl_message));
    FIELD(xvl_message, role);
    FIELD(xvl_message, text);
    FIELD(xvl_message, image_paths);
    FIELD(xvl_message, image_paths_len);
    printf("xvl_sampling %zu %zu\n", sizeof(xvl_sampling), _Alignof(xvl_sampling));
    FIELD(xvl_sampling, struct_size);
    FIELD(xvl_sampling, temperature);
    FIELD(xvl_sampling, top_k);
    FIELD(xvl_sampling, top_p);
    FIELD(xvl_sampling, seed);
    FIELD(xvl_sampling, max_tokens);

    /* Every declared function, linked. */
    any_fn fns[] = {
        (any_fn)xvl_version,        (any_fn)xvl_status_name,     (any_fn)xvl_last_error,
        (any_fn)xvl_open_options_init, (any_fn)xvl_open,         (any_fn)xvl_close,
        (any_fn)xvl_hidden_size,    (any_fn)xvl_vocab_size,      (any_fn)xvl_deepstack_sets,
        (any_fn)xvl_capacity,       (any_fn)xvl_kv_bytes,        (any_fn)xvl_next_slot,
        (any_fn)xvl_ab_report,
        (any_fn)xvl_reset,          (any_fn)xvl_truncate,        (any_fn)xvl_embed_row,
        (any_fn)xvl_step,           (any_fn)xvl_step_batch,      (any_fn)xvl_step_batch_embeds,
        (any_fn)xvl_sampling_init,  (any_fn)xvl_chat_open,       (any_fn)xvl_chat_close,
        (any_fn)xvl_chat_run,
    };
    size_t linked = 0;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) linked += fns[i] != NULL;
    printf("functions %zu\n", linked);
    printf("version %s\n", xvl_version());
    return 0;
}
