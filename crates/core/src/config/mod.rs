//! The configuration file (SPEC §2): typed model, loading and validation with precise errors.
