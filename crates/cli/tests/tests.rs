//! One integration binary (as ripgrep does), one module per area. Tests that need /dev/kvm,
//! tracefs or root skip with a printed reason only where the facility is absent.

mod it;
