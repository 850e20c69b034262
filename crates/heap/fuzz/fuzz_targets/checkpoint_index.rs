//! Hostile `model.safetensors.index.json` files: whatever index is accepted
//! must map every tensor to a plain file name beside the index (never `..`,
//! `/`, or an absolute path); everything else must be refused with an
//! error, never a panic (`iopath_heap::fuzz_checkpoint_index` asserts it).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = iopath_heap::fuzz_checkpoint_index(data);
});
