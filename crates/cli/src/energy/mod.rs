//! What `balance` and `top` share about energy: the weighted-event model and its TOML
//! (`model`), RAPL/powercap package energy (`powercap`), and the status a running balancer
//! publishes for `top` (`status`).

pub mod model;
pub mod powercap;
pub mod status;

pub use model::Model;
