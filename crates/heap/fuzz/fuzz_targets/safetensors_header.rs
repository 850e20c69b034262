//! Hostile safetensors files: the first byte picks the buffer size (1-64
//! pages), the rest is the file. Whatever header the loader accepts must
//! place every tensor inside the data, no two sharing bytes, and plan into
//! buffers that hold each tensor whole, aligned, read exactly once
//! (`iopath_heap::fuzz_safetensors` asserts it); everything else must be
//! refused with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&pages, file)) = data.split_first() {
        let _ = iopath_heap::fuzz_safetensors(file, usize::from(pages % 64) + 1);
    }
});
