//! The core's model tests: an in-memory database and simulated processes driving the
//! broker's public API, in hand-written scenarios and in property tests under random
//! interleavings.

mod db;
mod props;
mod scenarios;
mod sim;
