//! The exported C functions (declared in `include/xdna_vl.h`). Each one checks its pointers and lengths,
//! runs inside `guard` (no panic crosses into C), and maps a refusal to a status code plus the thread's
//! last-error message. The model work is the safe Rust API of `forward`.

use crate::chat::{self, XvlChat, XvlMessage, XvlSampling, XvlTextCallback};
use crate::ffi_args;
use crate::guard::guard;
use crate::handle::{self, XvlForward};
use crate::last_error;
use crate::options::{self, XvlOpenOptions};
use crate::status::*;
use decoder::{Decoder, HybridInputs, Logits};
use engine::{Event, Session, SessionOptions};
use packs::Pack;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// The C struct `xvl_hybrid`: everything `xvl_step_batch_embeds` needs beside the row embeddings.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XvlHybrid {
    /// Position planes, plane-major (t of every row, then h, then w): `3 x rows` values. NULL with
    /// `planes_len == 0` means plain positions `start_pos + i` on all three planes.
    pub planes: *const i64,
    pub planes_len: usize,
    /// Rotary position of the first row when `planes` is NULL.
    pub start_pos: i64,
    /// Prompt rows that are image rows, strictly ascending.
    pub image_rows: *const usize,
    pub image_rows_len: usize,
    /// DeepStack sets, `deepstack_sets x image_rows_len x hidden` values.
    pub deepstack: *const f32,
    pub deepstack_len: usize,
    pub deepstack_sets: usize,
}

/// The C struct `xvl_ab_stats`: how the host and device GEMMs compared so far (XVL_GEMM_AB).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct XvlAbStats {
    pub gemms: u64,
    /// GEMMs with at least one differing value.
    pub differing_gemms: u64,
    /// Values that differ at all (bitwise).
    pub differing_values: u64,
    pub max_abs_diff: f32,
}

const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

fn logits_kind(function: &str, which: u32) -> Result<Logits, CallError> {
    match which {
        XVL_LOGITS_LAST_ROW => Ok(Logits::LastRow),
        XVL_LOGITS_ALL_ROWS => Ok(Logits::AllRows),
        other => Err(CallError::argument(
            function,
            format!("which = {other}, expected XVL_LOGITS_LAST_ROW (0) or XVL_LOGITS_ALL_ROWS (1)"),
        )),
    }
}

/// Logit values a step of `rows` rows writes.
fn logits_needed(
    function: &str,
    h: &XvlForward,
    rows: usize,
    which: Logits,
) -> Result<usize, CallError> {
    match which {
        Logits::LastRow => Ok(h.vocab_size),
        Logits::AllRows => rows.checked_mul(h.vocab_size).ok_or_else(|| {
            CallError::argument(
                function,
                format!("{rows} rows x vocabulary {} overflows", h.vocab_size),
            )
        }),
    }
}

/// Copies a successful step's logits to the caller's buffer (already checked by `check_output`).
///
/// # Safety
/// `check_output(.., logits, _, produced.len())` must have passed; `logits` must be valid for writes
/// and no Rust reference to the caller's input buffers may be live (the step's borrows have ended).
unsafe fn copy_logits(logits: *mut f32, produced: &[f32]) {
    // SAFETY: the caller's contract above.
    unsafe { ffi_args::output(logits, produced.len()) }.copy_from_slice(produced);
}

/// Library version ("0.1.0"), static.
#[no_mangle]
pub extern "C" fn xvl_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

/// The name of a status code ("XVL_ERR_SLOT"), static.
#[no_mangle]
pub extern "C" fn xvl_status_name(status: XvlStatus) -> *const c_char {
    status_name(status).as_ptr().cast()
}

/// The last failing call's message on this thread ("" if none).
#[no_mangle]
pub extern "C" fn xvl_last_error() -> *const c_char {
    last_error::as_ptr()
}

/// Fills `*options` with the defaults (host GEMM, 2048 slots, all cores, f32 KV).
///
/// # Safety
/// `options` must be NULL or valid for a write of one `xvl_open_options`.
#[no_mangle]
pub unsafe extern "C" fn xvl_open_options_init(options: *mut XvlOpenOptions) -> XvlStatus {
    const F: &str = "xvl_open_options_init";
    guard(F, || {
        // SAFETY: NULL or valid for one write (the caller's contract).
        unsafe { ffi_args::write_out(F, "options", options, XvlOpenOptions::defaults()) }
    })
}

/// Opens the pack at `pack_path` and builds a forward over it; `*out` gets the handle (NULL on
/// failure).
///
/// # Safety
/// `pack_path` NULL or NUL-terminated; `options` NULL or an `xvl_open_options` (see options::read);
/// `out` NULL or valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn xvl_open(
    pack_path: *const c_char,
    options: *const XvlOpenOptions,
    out: *mut *mut XvlForward,
) -> XvlStatus {
    const F: &str = "xvl_open";
    guard(F, || {
        // SAFETY: NULL or valid for one write; cleared first so a failure never leaves garbage.
        unsafe { ffi_args::write_out(F, "out", out, std::ptr::null_mut()) }?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let path = unsafe { ffi_args::path(F, "pack_path", pack_path) }?;
        // SAFETY: NULL or a caller's options struct (the caller's contract).
        let request = unsafe { options::read(F, options) }?;
        let pack =
            Pack::open(&path).map_err(|e| CallError::new(XVL_ERR_PACK, format!("{F}: {e}")))?;
        let runtime = options::runtime(F, &request.runtime)?;
        let forward = Decoder::new(&Arc::new(pack), &runtime, request.decoder)
            .map_err(|e| CallError::forward(F, e))?;
        let handle = Box::into_raw(Box::new(XvlForward::new(forward)));
        // SAFETY: `out` was checked writable above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a handle. NULL is ignored.
///
/// # Safety
/// `f` must be NULL or an open handle no other thread is using; it must not be used again.
#[no_mangle]
pub unsafe extern "C" fn xvl_close(f: *mut XvlForward) {
    let _ = guard("xvl_close", || {
        if f.is_null() {
            return Ok(());
        }
        // SAFETY: an open handle (checked by tag, best effort) per the caller's contract.
        unsafe { handle::from_ptr("xvl_close", f) }?;
        // SAFETY: the pointer came from Box::into_raw in xvl_open and is freed exactly once.
        let mut boxed = unsafe { Box::from_raw(f) };
        boxed.retire();
        drop(boxed);
        Ok(())
    });
}

/// Writes one fact of the handle to `*out`.
///
/// # Safety
/// `f` NULL or an open handle; `out` NULL or valid for one write.
unsafe fn get(
    function: &'static str,
    f: *const XvlForward,
    out: *mut usize,
    fact: impl FnOnce(&XvlForward) -> Result<usize, CallError>,
) -> XvlStatus {
    guard(function, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(function, f) }?;
        let value = fact(h)?;
        // SAFETY: forwarded contract.
        unsafe { ffi_args::write_out(function, "out", out, value) }
    })
}

/// The model's hidden size (row embedding width).
///
/// # Safety
/// `f` NULL or an open handle; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn xvl_hidden_size(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe { get("xvl_hidden_size", f, out, |h| Ok(h.hidden_size)) }
}

/// The vocabulary size (logits per row).
///
/// # Safety
/// As `xvl_hidden_size`.
#[no_mangle]
pub unsafe extern "C" fn xvl_vocab_size(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe { get("xvl_vocab_size", f, out, |h| Ok(h.vocab_size)) }
}

/// DeepStack sets the pack declares.
///
/// # Safety
/// As `xvl_hidden_size`.
#[no_mangle]
pub unsafe extern "C" fn xvl_deepstack_sets(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe { get("xvl_deepstack_sets", f, out, |h| Ok(h.deepstack_sets)) }
}

/// KV cache slots (the capacity it was opened with).
///
/// # Safety
/// As `xvl_hidden_size`.
#[no_mangle]
pub unsafe extern "C" fn xvl_capacity(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe { get("xvl_capacity", f, out, |h| Ok(h.capacity)) }
}

/// Bytes the KV cache holds (every slot is allocated at open).
///
/// # Safety
/// As `xvl_hidden_size`.
#[no_mangle]
pub unsafe extern "C" fn xvl_kv_bytes(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe { get("xvl_kv_bytes", f, out, |h| Ok(h.kv_bytes)) }
}

/// Filled cache slots: the slot the next step must start at.
///
/// # Safety
/// As `xvl_hidden_size`.
#[no_mangle]
pub unsafe extern "C" fn xvl_next_slot(f: *const XvlForward, out: *mut usize) -> XvlStatus {
    // SAFETY: forwarded contract.
    unsafe {
        get("xvl_next_slot", f, out, |h| {
            Ok(h.lock("xvl_next_slot")?.next_slot())
        })
    }
}

/// How host and device compared so far, for a handle opened with `XVL_GEMM_AB`.
///
/// # Safety
/// `f` NULL or an open handle; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn xvl_ab_report(f: *const XvlForward, out: *mut XvlAbStats) -> XvlStatus {
    const F: &str = "xvl_ab_report";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        let forward = h.lock(F)?;
        let runtime = forward.runtime();
        let r = runtime.ab_report().ok_or_else(|| {
            CallError::argument(
                F,
                format!(
                    "the handle's GEMM backend is `{}`; only XVL_GEMM_AB compares host and device",
                    runtime.backend_name()
                ),
            )
        })?;
        let report = XvlAbStats {
            gemms: r.gemms,
            differing_gemms: r.differing_gemms,
            differing_values: r.differing_values,
            max_abs_diff: r.max_abs_diff,
        };
        // SAFETY: forwarded contract.
        unsafe { ffi_args::write_out(F, "out", out, report) }
    })
}

/// Forgets every cache slot (the next step starts at slot 0).
///
/// # Safety
/// `f` NULL or an open handle.
#[no_mangle]
pub unsafe extern "C" fn xvl_reset(f: *mut XvlForward) -> XvlStatus {
    const F: &str = "xvl_reset";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        h.lock(F)?.reset();
        Ok(())
    })
}

/// Forgets slots `len..` (decoding continues at slot `min(len, next slot)`). A Qwen3.5 pack's
/// recurrent state goes back only to a row of the last step (a draft window); anywhere else the
/// whole cache is forgotten: read `xvl_next_slot` after a cut.
///
/// # Safety
/// `f` NULL or an open handle.
#[no_mangle]
pub unsafe extern "C" fn xvl_truncate(f: *mut XvlForward, len: usize) -> XvlStatus {
    const F: &str = "xvl_truncate";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        // The slots kept are what xvl_next_slot reports.
        let _kept = h.lock(F)?.truncate(len);
        Ok(())
    })
}

/// The embedding row of `token` (`hidden` floats) into `out`.
///
/// # Safety
/// `f` NULL or an open handle; `out` NULL or valid for writes of `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn xvl_embed_row(
    f: *const XvlForward,
    token: u32,
    out: *mut f32,
    out_len: usize,
) -> XvlStatus {
    const F: &str = "xvl_embed_row";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        if token as usize >= h.vocab_size {
            return Err(CallError::new(
                XVL_ERR_TOKEN,
                format!(
                    "{F}: token id {token} is outside the vocabulary (0..{})",
                    h.vocab_size
                ),
            ));
        }
        ffi_args::check_output(F, "out", out, out_len, h.hidden_size)?;
        let forward = h.lock(F)?;
        // SAFETY: checked above; `out` is the caller's, no Rust reference aliases it.
        let row = unsafe { ffi_args::output(out, h.hidden_size) };
        forward.embed_row(token, row);
        Ok(())
    })
}

/// One token at `rotary_pos` (all three planes), written to `cache_slot`; the vocabulary's logits.
///
/// # Safety
/// `f` NULL or an open handle; `logits` NULL or valid for writes of `logits_len` floats.
#[no_mangle]
pub unsafe extern "C" fn xvl_step(
    f: *mut XvlForward,
    token: u32,
    rotary_pos: i64,
    cache_slot: usize,
    logits: *mut f32,
    logits_len: usize,
) -> XvlStatus {
    const F: &str = "xvl_step";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        ffi_args::check_output(F, "logits", logits, logits_len, h.vocab_size)?;
        let mut forward = h.lock(F)?;
        let produced = forward
            .step(token, rotary_pos, cache_slot)
            .map_err(|e| CallError::forward(F, e))?;
        // SAFETY: checked above; no input buffer of the caller is borrowed.
        unsafe { copy_logits(logits, produced) };
        Ok(())
    })
}

/// A text prompt: row i at rotary position `start_pos + i` and cache slot `start_slot + i`.
///
/// # Safety
/// `f` NULL or an open handle; `tokens` NULL or `n_tokens` readable `uint32_t`; `logits` NULL or
/// valid for writes of `logits_len` floats, not overlapping `tokens`.
#[no_mangle]
pub unsafe extern "C" fn xvl_step_batch(
    f: *mut XvlForward,
    tokens: *const u32,
    n_tokens: usize,
    start_pos: i64,
    start_slot: usize,
    which: u32,
    logits: *mut f32,
    logits_len: usize,
) -> XvlStatus {
    const F: &str = "xvl_step_batch";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        let which = logits_kind(F, which)?;
        if n_tokens == 0 {
            return Err(CallError::argument(
                F,
                "n_tokens is 0, a step needs at least one token",
            ));
        }
        // SAFETY: `n_tokens` readable u32 by the caller's contract.
        let tokens = unsafe { ffi_args::input(F, "tokens", tokens, n_tokens) }?;
        let needed = logits_needed(F, h, n_tokens, which)?;
        ffi_args::check_output(F, "logits", logits, logits_len, needed)?;
        let mut forward = h.lock(F)?;
        let produced = forward
            .step_batch(tokens, start_pos, start_slot, which)
            .map_err(|e| CallError::forward(F, e))?;
        // SAFETY: checked above; `tokens` is not used again, and the caller promised no overlap.
        unsafe { copy_logits(logits, produced) };
        Ok(())
    })
}

/// Rows given as embeddings (`rows x hidden` floats, `embeds_len` in total) with position planes,
/// image rows and DeepStack sets from `*hybrid`.
///
/// # Safety
/// `f` NULL or an open handle; every (pointer, length) pair NULL or readable for its length;
/// `hybrid` NULL or an `xvl_hybrid`; `logits` NULL or valid for writes of `logits_len` floats, not
/// overlapping any input.
#[no_mangle]
pub unsafe extern "C" fn xvl_step_batch_embeds(
    f: *mut XvlForward,
    embeds: *const f32,
    embeds_len: usize,
    hybrid: *const XvlHybrid,
    start_slot: usize,
    which: u32,
    logits: *mut f32,
    logits_len: usize,
) -> XvlStatus {
    const F: &str = "xvl_step_batch_embeds";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { handle::from_ptr(F, f) }?;
        let which = logits_kind(F, which)?;
        if hybrid.is_null() {
            return Err(CallError::null(F, "hybrid"));
        }
        if !hybrid.is_aligned() {
            return Err(CallError::argument(F, "`hybrid` is not aligned"));
        }
        // SAFETY: non-NULL, aligned, and an xvl_hybrid by the caller's contract.
        let hy = unsafe { hybrid.read() };
        let hidden = h.hidden_size;
        if embeds_len == 0 || !embeds_len.is_multiple_of(hidden) {
            return Err(CallError::new(
                XVL_ERR_INPUTS,
                format!("{F}: embeds_len = {embeds_len}, not a positive multiple of hidden size {hidden}"),
            ));
        }
        let rows = embeds_len / hidden;
        let needed = logits_needed(F, h, rows, which)?;
        ffi_args::check_output(F, "logits", logits, logits_len, needed)?;
        // The forward owns its hybrid inputs; copying them is small next to the step itself.
        // Each array: NULL only with length 0, else readable for its length (the caller's contract).
        let planes = if hy.planes.is_null() && hy.planes_len == 0 {
            None
        } else {
            // SAFETY: `hybrid.planes` readable for `planes_len` i64 by the caller's contract.
            let p = unsafe { ffi_args::input(F, "hybrid.planes", hy.planes, hy.planes_len) }?;
            Some(p.to_vec())
        };
        // SAFETY: `hybrid.image_rows` readable for `image_rows_len` size_t by the caller's contract.
        let image_rows =
            unsafe { ffi_args::input(F, "hybrid.image_rows", hy.image_rows, hy.image_rows_len) }?;
        // SAFETY: `hybrid.deepstack` readable for `deepstack_len` floats by the caller's contract.
        let deepstack =
            unsafe { ffi_args::input(F, "hybrid.deepstack", hy.deepstack, hy.deepstack_len) }?;
        let inputs = HybridInputs {
            planes,
            start_pos: hy.start_pos,
            image_rows: image_rows.to_vec(),
            deepstack: deepstack.to_vec(),
            deepstack_sets: hy.deepstack_sets,
        };
        let mut forward = h.lock(F)?;
        let produced = {
            // SAFETY: `embeds_len` readable floats by the caller's contract; the borrow ends with
            // this block, before the logits are written.
            let embeds = unsafe { ffi_args::input(F, "embeds", embeds, embeds_len) }?;
            forward
                .step_batch_embeds(embeds, &inputs, start_slot, which)
                .map_err(|e| CallError::forward(F, e))?
        };
        // SAFETY: checked above; the caller's input buffers are no longer borrowed.
        unsafe { copy_logits(logits, produced) };
        Ok(())
    })
}

/// Fills `*sampling` with the defaults (greedy, 256 tokens at most, seed 0).
///
/// # Safety
/// `sampling` must be NULL or valid for a write of one `xvl_sampling`.
#[no_mangle]
pub unsafe extern "C" fn xvl_sampling_init(sampling: *mut XvlSampling) -> XvlStatus {
    const F: &str = "xvl_sampling_init";
    guard(F, || {
        // SAFETY: NULL or valid for one write (the caller's contract).
        unsafe { ffi_args::write_out(F, "sampling", sampling, XvlSampling::defaults()) }
    })
}

/// Opens the pack at `pack_path` as a chat: the engine's session (tokenizer, chat template, vision
/// tower and decoder of the pack). `options.capacity` is the context (prompt + answer).
///
/// # Safety
/// As for `xvl_open`.
#[no_mangle]
pub unsafe extern "C" fn xvl_chat_open(
    pack_path: *const c_char,
    options: *const XvlOpenOptions,
    out: *mut *mut XvlChat,
) -> XvlStatus {
    const F: &str = "xvl_chat_open";
    guard(F, || {
        // SAFETY: NULL or valid for one write; cleared first so a failure never leaves garbage.
        unsafe { ffi_args::write_out(F, "out", out, std::ptr::null_mut()) }?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let path = unsafe { ffi_args::path(F, "pack_path", pack_path) }?;
        // SAFETY: NULL or a caller's options struct (the caller's contract).
        let request = unsafe { options::read(F, options) }?;
        let session_options = SessionOptions {
            context: request.decoder.capacity,
            kv_dtype: request.decoder.kv_dtype,
            runtime: request.runtime,
            ..SessionOptions::default()
        };
        let session =
            Session::open(&path, None, &session_options).map_err(|e| CallError::engine(F, e))?;
        let handle = Box::into_raw(Box::new(XvlChat::new(session)));
        // SAFETY: `out` was checked writable above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a chat handle. NULL is ignored.
///
/// # Safety
/// `chat` must be NULL or an open chat handle no other thread is using; it must not be used again.
#[no_mangle]
pub unsafe extern "C" fn xvl_chat_close(chat: *mut XvlChat) {
    let _ = guard("xvl_chat_close", || {
        if chat.is_null() {
            return Ok(());
        }
        // SAFETY: an open handle (checked by tag, best effort) per the caller's contract.
        unsafe { chat::from_ptr("xvl_chat_close", chat) }?;
        // SAFETY: from Box::into_raw in xvl_chat_open, freed exactly once.
        let mut boxed = unsafe { Box::from_raw(chat) };
        boxed.retire();
        drop(boxed);
        Ok(())
    });
}

/// Answers a conversation: `messages` (ending with a user turn) through the engine's one generate
/// loop. Each piece of the answer goes to `on_text` (if not NULL) as it is produced; the whole
/// answer, NUL-terminated, to `text` (if not NULL) and its size with the NUL to `*text_needed` (if
/// not NULL).
///
/// # Safety
/// `chat` NULL or an open chat handle; `messages` NULL or `messages_len` valid `xvl_message`s;
/// `sampling` NULL or an `xvl_sampling`; `on_text` NULL or a function of the documented type;
/// `text` NULL or valid for `text_len` byte writes; `text_needed` NULL or valid for one write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn xvl_chat_run(
    chat: *mut XvlChat,
    messages: *const XvlMessage,
    messages_len: usize,
    sampling: *const XvlSampling,
    on_text: XvlTextCallback,
    user_data: *mut c_void,
    text: *mut c_char,
    text_len: usize,
    text_needed: *mut usize,
) -> XvlStatus {
    const F: &str = "xvl_chat_run";
    guard(F, || {
        // SAFETY: forwarded contract.
        let h = unsafe { chat::from_ptr(F, chat) }?;
        if text.is_null() && text_len > 0 {
            return Err(CallError::null(F, "text"));
        }
        // SAFETY: forwarded contract.
        let params = unsafe { chat::sampling(F, sampling) }?;
        let mut session = h.lock(F)?;
        // SAFETY: forwarded contract.
        let messages = unsafe { chat::messages(F, &session, messages, messages_len) }?;
        let generation = session
            .generate(&messages, &params, &mut |event| match event {
                // SAFETY: forwarded contract.
                Event::Text(piece) => unsafe { chat::deliver(on_text, user_data, piece) },
                Event::Started { .. } => true,
            })
            .map_err(|e| CallError::engine(F, e))?;
        let needed = generation.text.len() + 1;
        if !text_needed.is_null() {
            // SAFETY: non-NULL, valid for one write (the caller's contract).
            unsafe { ffi_args::write_out(F, "text_needed", text_needed, needed) }?;
        }
        if !text.is_null() {
            if text_len < needed {
                return Err(CallError::new(
                    XVL_ERR_BUFFER,
                    format!(
                        "{F}: `text` holds {text_len} bytes, the answer needs {needed} (with its NUL; \
                         *text_needed says so too)"
                    ),
                ));
            }
            // SAFETY: `text` is non-NULL with at least `needed` writable bytes (checked above,
            // the caller's contract for text_len).
            let out = unsafe { ffi_args::output(text.cast::<u8>(), needed) };
            out[..needed - 1].copy_from_slice(generation.text.as_bytes());
            out[needed - 1] = 0;
        }
        Ok(())
    })
}
