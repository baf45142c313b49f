pub mod bombs;
