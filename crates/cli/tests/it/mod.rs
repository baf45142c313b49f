mod doctor;
mod errors;
mod exits;
mod perf_stat;
mod stats;
mod testvm;
mod util;
