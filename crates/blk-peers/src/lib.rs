//! Test-only crate: front ends written by others drive iopath's
//! vhost-user-blk back end. Its tests and examples hold everything.
