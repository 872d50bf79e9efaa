//! Zeroed, 64-byte aligned byte blocks: a buffer's host view and its "device" copy.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

pub struct AlignedBytes {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBytes owns its allocation exclusively (like a Box<[u8]>); access goes through
// &self / &mut self, or through the raw host mapping whose use the ABI's contract serialises.
unsafe impl Send for AlignedBytes {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    pub const ALIGN: usize = 64;

    /// None when `len` is zero or the allocation fails.
    pub fn zeroed(len: usize) -> Option<AlignedBytes> {
        if len == 0 {
            return None;
        }
        let layout = Layout::from_size_align(len, Self::ALIGN).ok()?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| AlignedBytes { ptr, layout })
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// The address handed to the host as the buffer's mapping.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is `len` initialised (zeroed) bytes, alive while self is.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self makes this view unique among Rust references.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
