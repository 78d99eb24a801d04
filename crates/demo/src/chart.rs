//! The demo's chart: offered, admitted and the limit of the surged bucket over time, as SVG
//! (plotters' SVG backend only, so no font library is needed).

use std::path::Path;

use plotters::prelude::*;

use crate::DemoError;
use crate::load::{BIN, Recorder};
use crate::summary::BucketPlan;

/// Points every 250 ms: five recorder bins.
const STEP_BINS: usize = 5;

/// Writes the chart of `plan` (series 0 of `recorder`) over `seconds` to `path`.
pub fn write(
    path: &Path,
    recorder: &Recorder,
    plan: &BucketPlan,
    seconds: f64,
) -> Result<(), DemoError> {
    draw(path, recorder, plan, seconds).map_err(|e| DemoError::Chart(e.to_string()))
}

fn draw(
    path: &Path,
    recorder: &Recorder,
    plan: &BucketPlan,
    seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let series = &recorder.series[0];
    let bins = (seconds / BIN.as_secs_f64()) as usize;
    let mut offered = Vec::new();
    let mut admitted = Vec::new();
    for start in (0..bins).step_by(STEP_BINS) {
        let (o, a) = series.rates(start, start + STEP_BINS);
        let t = (start + STEP_BINS) as f64 * BIN.as_secs_f64();
        offered.push((t, o));
        admitted.push((t, a));
    }
    let max = offered.iter().map(|p| p.1).fold(plan.limit, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("spillway demo: {} under a 15x surge", plan.name),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests/s")
        .draw()?;
    let style = |c: &RGBColor| ShapeStyle::from(c).stroke_width(2);
    chart
        .draw_series(LineSeries::new(offered, style(&BLUE)))?
        .label("offered")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(admitted, style(&GREEN)))?
        .label("admitted")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, plan.limit), (seconds, plan.limit)],
            style(&RED),
        ))?
        .label("limit")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}
