//! `xvl_chat`: the engine's `Session` behind an opaque handle — messages in (role, text, pictures by
//! path), answer text out. The generate loop, the prompt, the pictures and the sampling are the
//! engine's; this file only turns C arrays into `Message`s and `SamplingParams`.

use crate::ffi_args;
use crate::status::*;
use engine::{Message, SamplingParams, Session};
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, MutexGuard};

/// Tags a live chat handle (not an `xvl_forward`: the two tags differ).
const MAGIC: u64 = u64::from_le_bytes(*b"xvlchat1");

/// The C struct `xvl_message`: one turn of the conversation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XvlMessage {
    /// `XVL_ROLE_SYSTEM`, `XVL_ROLE_USER` or `XVL_ROLE_ASSISTANT`.
    pub role: u32,
    /// UTF-8, NUL-terminated.
    pub text: *const c_char,
    /// Paths of the pictures shown before the text (user turns only).
    pub image_paths: *const *const c_char,
    pub image_paths_len: usize,
}

/// The C struct `xvl_sampling`: how the next token is chosen.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XvlSampling {
    /// `sizeof(xvl_sampling)` as the caller compiled it.
    pub struct_size: u32,
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    pub seed: u64,
    pub max_tokens: usize,
}

impl XvlSampling {
    pub const SIZE: u32 = std::mem::size_of::<XvlSampling>() as u32;

    /// What `xvl_sampling_init` writes: greedy, 256 tokens at most.
    pub fn defaults() -> XvlSampling {
        let d = SamplingParams::default();
        XvlSampling {
            struct_size: XvlSampling::SIZE,
            temperature: d.temperature,
            top_k: d.top_k as u32,
            top_p: d.top_p,
            seed: d.seed,
            max_tokens: d.max_tokens,
        }
    }
}

/// Called with each piece of the answer as it is produced: `len` bytes of UTF-8 (whole characters),
/// followed by a NUL. Returns 0 to go on; anything else ends the answer there.
pub type XvlTextCallback =
    Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user_data: *mut c_void) -> i32>;

/// `repr(C)` so `magic` is the first 8 bytes.
#[repr(C)]
pub struct XvlChat {
    magic: u64,
    session: Mutex<Session>,
}

const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<XvlChat>();
};

impl XvlChat {
    pub fn new(session: Session) -> XvlChat {
        XvlChat {
            magic: MAGIC,
            session: Mutex::new(session),
        }
    }

    /// The session, for one call. A lock poisoned by a panic refuses every later call.
    pub fn lock(&self, function: &str) -> Result<MutexGuard<'_, Session>, CallError> {
        self.session.lock().map_err(|_| {
            CallError::new(
                XVL_ERR_PANIC,
                format!("{function}: the handle is unusable after an internal panic in an earlier call; close it"),
            )
        })
    }

    pub fn retire(&mut self) {
        self.magic = 0;
    }
}

/// The chat handle behind a C pointer.
///
/// # Safety
/// `ptr` must be NULL or a pointer `xvl_chat_open` returned that has not been closed.
pub unsafe fn from_ptr<'a>(function: &str, ptr: *const XvlChat) -> Result<&'a XvlChat, CallError> {
    if ptr.is_null() {
        return Err(CallError::null(function, "chat"));
    }
    if !ptr.is_aligned() {
        return Err(CallError::argument(
            function,
            "`chat` is not a handle (misaligned)",
        ));
    }
    // SAFETY: non-NULL and aligned; reads only the first 8 bytes (the caller guarantees a handle).
    let magic = unsafe { std::ptr::addr_of!((*ptr).magic).read() };
    if magic != MAGIC {
        return Err(CallError::argument(
            function,
            "`chat` is not an open xvl_chat handle (closed, or not from xvl_chat_open)",
        ));
    }
    // SAFETY: tagged as live; not closed by the caller's contract.
    Ok(unsafe { &*ptr })
}

/// A C string as UTF-8 text.
///
/// # Safety
/// `ptr` NULL or NUL-terminated, valid for the call.
unsafe fn text<'a>(function: &str, what: &str, ptr: *const c_char) -> Result<&'a str, CallError> {
    if ptr.is_null() {
        return Err(CallError::null(function, what));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    std::str::from_utf8(bytes)
        .map_err(|e| CallError::argument(function, format!("`{what}` is not UTF-8: {e}")))
}

/// The caller's messages as the engine's, every picture loaded and preprocessed (a missing or bad
/// picture is refused here, before the cache moves).
///
/// # Safety
/// `messages` NULL or `len` valid `xvl_message`s whose strings and arrays are valid for the call.
pub unsafe fn messages(
    function: &str,
    session: &Session,
    messages: *const XvlMessage,
    len: usize,
) -> Result<Vec<Message>, CallError> {
    if len == 0 {
        return Err(CallError::argument(
            function,
            "`messages_len` is 0: a chat needs at least one user message",
        ));
    }
    // SAFETY: forwarded contract.
    let list = unsafe { ffi_args::input(function, "messages", messages, len) }?;
    let mut out = Vec::with_capacity(len);
    for (i, m) in list.iter().enumerate() {
        let what = format!("messages[{i}].text");
        // SAFETY: forwarded contract.
        let body = unsafe { text(function, &what, m.text) }?;
        let what = format!("messages[{i}].image_paths");
        // SAFETY: forwarded contract.
        let paths = unsafe { ffi_args::input(function, &what, m.image_paths, m.image_paths_len) }?;
        if !paths.is_empty() && m.role != XVL_ROLE_USER {
            return Err(CallError::argument(
                function,
                format!("messages[{i}] has {} pictures, but only a user message (XVL_ROLE_USER) can show pictures", paths.len()),
            ));
        }
        let mut images = Vec::with_capacity(paths.len());
        for (j, &p) in paths.iter().enumerate() {
            let what = format!("messages[{i}].image_paths[{j}]");
            // SAFETY: forwarded contract.
            let path = unsafe { ffi_args::path(function, &what, p) }?;
            let image = session.load_image(&path).map_err(|e| {
                let e = CallError::engine(function, e);
                CallError::new(e.status, format!("{what}: {}", e.message))
            })?;
            images.push(image);
        }
        out.push(match m.role {
            XVL_ROLE_SYSTEM => Message::system(body),
            XVL_ROLE_USER => Message::user(images, body),
            XVL_ROLE_ASSISTANT => Message::assistant(body),
            other => {
                return Err(CallError::argument(
                    function,
                    format!("messages[{i}].role = {other}, expected XVL_ROLE_SYSTEM (0), XVL_ROLE_USER (1) or XVL_ROLE_ASSISTANT (2)"),
                ))
            }
        });
    }
    Ok(out)
}

/// The caller's sampling as the engine's (NULL: greedy, 256 tokens), checked by the engine.
///
/// # Safety
/// `sampling` NULL or an aligned `xvl_sampling` of at least its `struct_size` bytes.
pub unsafe fn sampling(
    function: &str,
    sampling: *const XvlSampling,
) -> Result<SamplingParams, CallError> {
    let s = if sampling.is_null() {
        XvlSampling::defaults()
    } else {
        if !sampling.is_aligned() {
            return Err(CallError::argument(function, "`sampling` is not aligned"));
        }
        // SAFETY: non-NULL and aligned; the caller guarantees the first field is readable.
        let size = unsafe { std::ptr::addr_of!((*sampling).struct_size).read() };
        if size != XvlSampling::SIZE {
            return Err(CallError::argument(
                function,
                format!(
                    "sampling.struct_size = {size}, this library's xvl_sampling is {} bytes (call xvl_sampling_init)",
                    XvlSampling::SIZE
                ),
            ));
        }
        // SAFETY: as large as ours and aligned.
        unsafe { sampling.read() }
    };
    let params = SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        seed: s.seed,
        max_tokens: s.max_tokens,
        ..SamplingParams::default()
    };
    params
        .validate()
        .map_err(|e| CallError::engine(function, e))?;
    Ok(params)
}

/// Hands one piece to the caller's callback (NUL-terminated copy); false = the caller stops.
///
/// # Safety
/// `callback` must be a function of the documented type, safe to call with `user_data`.
pub unsafe fn deliver(callback: XvlTextCallback, user_data: *mut c_void, piece: &str) -> bool {
    let Some(f) = callback else { return true };
    let mut bytes = Vec::with_capacity(piece.len() + 1);
    bytes.extend_from_slice(piece.as_bytes());
    bytes.push(0);
    // SAFETY: the caller's contract; the piece outlives the call.
    unsafe { f(bytes.as_ptr().cast(), piece.len(), user_data) == 0 }
}
