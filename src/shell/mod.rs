//! The Valkey glue: thin, and each concern in one file.

pub mod blocking;
pub mod commands;
pub mod compound;
pub mod controls;
pub mod datatype;
mod docs;
pub mod ffi;
pub mod leases;
pub mod metrics;
pub mod register;
pub mod replication;
