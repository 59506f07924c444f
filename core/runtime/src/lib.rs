//! The ruststream runtime: the service that runs subscriptions on a database table used as a
//! message queue. It will drive the sans-IO core (`ruststream-core`) through a driver adapter,
//! start handlers on workers, settle rows by their outcome, and order shutdown.
//!
//! The runtime is not written yet; the crate holds its place in the workspace.
