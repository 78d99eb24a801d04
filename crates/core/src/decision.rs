//! A decision is a value: allow, drop (with bucket and retry-after) or shadow-drop.
