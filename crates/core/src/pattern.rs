//! Patterns in `match`: exact strings and globs with `*`.
