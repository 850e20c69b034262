//! Transports: how a driver reaches its device.

pub mod vhost_user;
