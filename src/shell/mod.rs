//! The Valkey glue: thin, and each concern in one file.

pub mod blocking;
pub mod commands;
pub mod compound;
pub mod controls;
pub mod datatype;
pub mod denied_report;
mod docs;
pub mod events;
pub mod ffi;
pub mod keytype;
pub mod leases;
pub mod metrics;
pub mod policy_stats;
pub mod propagation;
pub mod register;
pub mod replication;
pub mod stored;
