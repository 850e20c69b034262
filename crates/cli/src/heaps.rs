//! `iopath heaps`: which heaps this kernel has, what direct I/O can do with
//! each, and what `--heap auto` takes.

/// One line per heap ([`iopath_heap::HeapStatus`]), then the `auto` line.
pub fn run() {
    for h in iopath_heap::survey_heaps() {
        println!("{h}");
    }
    let c = iopath_heap::choose_heap();
    println!("{:<16} {}: {}", "auto", c.heap.name(), c.why);
}
