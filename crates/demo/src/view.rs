//! The demo's live view on stderr: a progress bar for the run and one line per bucket (limit,
//! offered, admitted, drop ratio), redrawn in place on a terminal; plain lines once a second
//! when stderr is not a terminal (CI logs, pipes).

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One bucket's line.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub name: &'static str,
    pub limit: f64,
    pub offered: f64,
    pub admitted: f64,
    pub drop_ratio: f64,
}

impl Row {
    fn line(&self) -> String {
        format!(
            "{:<14} limit {:>5.0}/s  offered {:>6.0}/s  admitted {:>6.0}/s  drop ratio {:>5.3}",
            self.name, self.limit, self.offered, self.admitted, self.drop_ratio
        )
    }
}

/// The live view.
pub struct View {
    bars: Option<(MultiProgress, ProgressBar, Vec<ProgressBar>)>,
    last_plain: Option<u64>,
}

impl View {
    /// A view of a run of `seconds`; `terminal` redraws in place.
    pub fn new(seconds: u64, terminal: bool) -> Self {
        let bars = terminal.then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let run = multi.add(ProgressBar::new(seconds));
            run.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} s  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            (multi, run, Vec::new())
        });
        View {
            bars,
            last_plain: None,
        }
    }

    /// Shows `rows` at `elapsed` into the run.
    pub fn update(&mut self, elapsed: Duration, rows: &[Row]) {
        match &mut self.bars {
            Some((multi, run, lines)) => {
                run.set_position(elapsed.as_secs());
                while lines.len() < rows.len() {
                    let line = multi.add(ProgressBar::new_spinner());
                    line.set_style(
                        ProgressStyle::with_template("{msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    lines.push(line);
                }
                for (line, row) in lines.iter().zip(rows) {
                    line.set_message(row.line());
                }
            }
            None => {
                let second = elapsed.as_secs();
                if self.last_plain == Some(second) {
                    return;
                }
                self.last_plain = Some(second);
                for row in rows {
                    eprintln!("[{second:>3} s] {}", row.line());
                }
            }
        }
    }

    /// Leaves the last view on screen.
    pub fn finish(&mut self) {
        if let Some((_, run, lines)) = &self.bars {
            run.finish();
            for line in lines {
                line.finish();
            }
        }
    }
}
