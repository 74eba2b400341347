//! Host memory handed to Python by address: Mooncake's
//! `MooncakeHostMemAllocator` (SGLang allocates its host KV pool with it in
//! standalone-storage mode) and the C allocation functions whose addresses
//! `get_alloc_func_addr` / `get_free_func_addr` give out (PyTorch's
//! pluggable-allocator signatures).
//!
//! Blocks are zeroed, aligned to 4 KiB (2 MiB from 2 MiB up, so the kernel
//! may back them with huge pages), and recorded, so that `free` of an
//! address this module did not hand out is refused instead of corrupting
//! the heap.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// Blocks handed out and not yet freed, by address.
static BLOCKS: Mutex<Option<HashMap<usize, Layout>>> = Mutex::new(None);

/// Alignment for a block of `size` bytes.
fn align_for(size: usize) -> usize {
    if size >= 2 << 20 {
        2 << 20
    } else {
        4096
    }
}

/// A zeroed block of `size` bytes; its address, or 0 when `size` is 0 or
/// the memory cannot be had.
pub fn alloc(size: usize) -> usize {
    if size == 0 {
        return 0;
    }
    let Ok(layout) = Layout::from_size_align(size, align_for(size)) else {
        return 0;
    };
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return 0;
    }
    let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    blocks
        .get_or_insert_with(HashMap::new)
        .insert(p as usize, layout);
    p as usize
}

/// Frees a block [`alloc`] handed out: 0, or -1 for an address that is
/// not one (never freed twice, never someone else's memory).
pub fn free(ptr: usize) -> i32 {
    let layout = {
        let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
        blocks.as_mut().and_then(|b| b.remove(&ptr))
    };
    match layout {
        Some(layout) => {
            // SAFETY: `ptr` came from `alloc_zeroed` with this very layout
            // and was removed from the table, so it is freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            0
        }
        None => -1,
    }
}

/// PyTorch's pluggable-allocator `alloc(size, device, stream)`.
///
/// # Safety
/// Callable from C with any arguments; `device` and `stream` are unused.
pub unsafe extern "C" fn kvpool_host_alloc(
    size: usize,
    _device: i32,
    _stream: *mut c_void,
) -> *mut c_void {
    alloc(size) as *mut c_void
}

/// PyTorch's pluggable-allocator `free(ptr, size, device, stream)`.
///
/// # Safety
/// Callable from C with any arguments; an address [`alloc`] did not hand
/// out is ignored.
pub unsafe extern "C" fn kvpool_host_free(
    ptr: *mut c_void,
    _size: usize,
    _device: i32,
    _stream: *mut c_void,
) {
    let _ = free(ptr as usize);
}

/// The address of [`kvpool_host_alloc`], for callers that take C function pointers.
pub fn alloc_fn_addr() -> usize {
    kvpool_host_alloc as *const () as usize
}

/// The address of [`kvpool_host_free`].
pub fn free_fn_addr() -> usize {
    kvpool_host_free as *const () as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zeroed_aligned_and_freed_once() {
        assert_eq!(alloc(0), 0);
        assert_eq!(alloc(usize::MAX / 2), 0);
        let p = alloc(10_000);
        assert_ne!(p, 0);
        assert_eq!(p % 4096, 0);
        // SAFETY: a live block of 10,000 bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 10_000) };
        assert!(s.iter().all(|&b| b == 0));
        s[9_999] = 7;
        assert_eq!(free(p), 0);
        assert_eq!(free(p), -1, "freed twice");
        assert_eq!(free(12345), -1, "not ours");
        let big = alloc(4 << 20);
        assert_eq!(big % (2 << 20), 0);
        assert_eq!(free(big), 0);
    }

    #[test]
    fn c_entry_points() {
        // SAFETY: the functions take any arguments.
        unsafe {
            let p = kvpool_host_alloc(64, 0, std::ptr::null_mut());
            assert!(!p.is_null());
            kvpool_host_free(p, 64, 0, std::ptr::null_mut());
            kvpool_host_free(p, 64, 0, std::ptr::null_mut());
        }
        assert_ne!(alloc_fn_addr(), free_fn_addr());
    }
}
