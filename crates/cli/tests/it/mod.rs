mod doctor;
mod errors;
mod perf_stat;
mod stats;
mod testvm;
mod util;
