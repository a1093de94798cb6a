//! The Valkey glue: thin, and each concern in one file.

pub mod commands;
pub mod compound;
pub mod controls;
pub mod datatype;
mod docs;
pub mod ffi;
pub mod metrics;
pub mod register;
pub mod replication;
