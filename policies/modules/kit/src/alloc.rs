//! A global allocator for guest modules. A decision allocates a handful of small
//! blocks (the lowered arguments, the answer's strings) and frees them all when it returns, which
//! Rust's default wasm allocator (dlmalloc) does with a general-purpose search every time.
//!
//! Blocks up to [`LARGEST`] bytes come in power-of-two classes, each with its own free list: an
//! allocation pops a block of its class (or carves one from fresh memory) and a free pushes it
//! back, both in a few instructions. Larger blocks go to the system allocator. Memory held by a
//! class is never given to another, so a guest's footprint is its peak per class; the host's
//! memory cap still bounds it.
//!
//! Wasm guests are single-threaded (no threads proposal here), which is what makes the unguarded
//! free lists sound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// The largest block served from a class; larger ones go to the system allocator.
const LARGEST: usize = 4096;
/// Classes 8, 16, ..., 4096 bytes.
const CLASSES: usize = 10;
const SMALLEST_SHIFT: u32 = 3;
/// Fresh memory is taken from the system allocator this many bytes at a time.
const CHUNK: usize = 64 * 1024;

#[cfg(not(target_arch = "wasm32"))]
compile_error!("guest-kit's allocator is for single-threaded wasm32 guests only");

pub struct SizeClasses {
    state: UnsafeCell<State>,
}

struct State {
    /// Per class, the first free block; each free block holds the address of the next.
    free: [*mut u8; CLASSES],
    /// The unused rest of the current chunk.
    next: *mut u8,
    end: *mut u8,
}

// SAFETY: wasm32 guests without the threads proposal have exactly one thread.
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    pub const fn new() -> SizeClasses {
        SizeClasses {
            state: UnsafeCell::new(State {
                free: [ptr::null_mut(); CLASSES],
                next: ptr::null_mut(),
                end: ptr::null_mut(),
            }),
        }
    }
}

impl Default for SizeClasses {
    fn default() -> SizeClasses {
        SizeClasses::new()
    }
}

/// The class of a layout, or `None` when it is served by the system allocator.
fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(1 << SMALLEST_SHIFT);
    if size > LARGEST {
        return None;
    }
    let rounded = size.next_power_of_two();
    Some((rounded.trailing_zeros() - SMALLEST_SHIFT) as usize)
}

const fn class_size(class: usize) -> usize {
    1 << (class as u32 + SMALLEST_SHIFT)
}

unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(layout) else {
            return System.alloc(layout);
        };
        // SAFETY: one thread (see the `Sync` impl), and no re-entrancy: nothing here allocates.
        let state = &mut *self.state.get();
        let head = state.free[class];
        if !head.is_null() {
            state.free[class] = *(head as *mut *mut u8);
            return head;
        }
        let size = class_size(class);
        // Blocks of a class are aligned to their size: chunks are LARGEST-aligned and every
        // carve is rounded up to the class size.
        let mut start = state.next.wrapping_add(state.next.align_offset(size));
        if state.next.is_null() || start.wrapping_add(size) > state.end {
            let chunk = System.alloc(Layout::from_size_align_unchecked(CHUNK, LARGEST));
            if chunk.is_null() {
                return chunk;
            }
            state.end = chunk.add(CHUNK);
            start = chunk;
        }
        state.next = start.add(size);
        start
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout) else {
            return System.dealloc(block, layout);
        };
        // SAFETY: as in `alloc`; `block` came from this class, so it can hold a pointer.
        let state = &mut *self.state.get();
        *(block as *mut *mut u8) = state.free[class];
        state.free[class] = block;
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grown = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class_of(layout), class_of(grown)) {
            // Still fits its block: nothing to move.
            (Some(old), Some(new)) if old == new => block,
            (None, None) => System.realloc(block, layout, new_size),
            _ => {
                let moved = self.alloc(grown);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    self.dealloc(block, layout);
                }
                moved
            }
        }
    }
}
