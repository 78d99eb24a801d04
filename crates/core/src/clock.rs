//! Time for the core: a `Clock` trait, the system clock and a fake clock for tests.
