//! What `balance` and `top` share about energy: the weighted-event model and its TOML
//! (`model`), RAPL/powercap package energy (`powercap`), the status a running balancer
//! publishes for `top` (`status`), and the live per-core book `top` keeps (`book`).

pub mod book;
pub mod model;
pub mod powercap;
pub mod status;

pub use model::Model;
