//! A region's traffic history as its controller hands it out for storing, one closed slot at a
//! time: plain data, so that the store that writes it needs nothing of the control loop that
//! sums it (spillway-loop's ledger).

/// One bucket's counts over one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    pub service: String,
    pub bucket: String,
    pub offered: u64,
    pub admitted: u64,
    pub shadow_dropped: u64,
    /// What the bucket's candidate limit would have dropped.
    pub candidate_dropped: u64,
}

/// One closed slot of a region: when it starts (Unix ms), how many seconds of it the region was
/// heard from, and each bucket's counts.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryBatch {
    pub start_ms: u64,
    pub seconds: f64,
    pub rows: Vec<HistoryRow>,
}
