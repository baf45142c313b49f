//! Small identifier newtypes, so a CPU number is never confused with a thread id.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A process id (the VMM process of a VM).
    Pid
);
id_type!(
    /// A thread id (a vCPU thread, or any task seen in a trace).
    Tid
);
id_type!(
    /// A logical CPU number of the host.
    Cpu
);
