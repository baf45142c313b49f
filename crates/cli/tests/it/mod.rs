mod doctor;
mod errors;
mod exits;
mod perf_stat;
mod record;
mod stats;
mod testvm;
mod util;
