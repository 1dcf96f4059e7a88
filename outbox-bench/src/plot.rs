//! PNG plots of the report (plotters, bitmap backend). Text is drawn with DejaVu Sans, read at
//! run time; a plot that cannot be drawn is an error for the report, never a panic of the bench.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// The font the plots are labelled with (Debian/Ubuntu package `fonts-dejavu-core`).
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Registers [`FONT`] as `sans-serif`, once.
fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = read_font(Path::new(FONT))?;
        register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a font plotters can read"))
    })
    .clone()
}

/// The font file's bytes, for the life of the process.
fn read_font(path: &Path) -> Result<&'static [u8], String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "the plots need the font {} ({e}); install the package `fonts-dejavu-core`",
            path.display()
        )
    })?;
    Ok(Box::leak(bytes.into_boxed_slice()))
}

/// Runs a drawing, turning its errors and panics into a message.
fn guarded(what: &str, f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    font()?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: plotters panicked")),
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// 1, 2, 5, 10, 20, 50, … within `lo..=hi`.
fn key_points(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= lo * 0.999 && v <= hi * 1.001 {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// Histogram of latencies (ms), one outline per variant, over logarithmic buckets
/// (10 per decade); the y axis is the share of the variant's events per bucket.
pub fn latency_histogram(
    path: &Path,
    title: &str,
    variants: &[(String, Vec<f64>)],
) -> Result<(), String> {
    guarded("latency histogram", || {
        let all = variants.iter().flat_map(|(_, v)| v.iter().copied());
        let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
        if hi <= 0.0 {
            return Err("no latencies to plot".into());
        }
        // Bucket k spans [10^(k/10), 10^((k+1)/10)) ms; the first one takes everything below
        // it (from 1 ms at the lowest).
        let k_lo = (lo.max(1.0).log10() * 10.0).floor() as i32;
        let k_hi = (hi.max(1.0).log10() * 10.0).floor() as i32 + 1;
        let edge = |k: i32| 10f64.powf(k as f64 / 10.0);
        let shares: Vec<Vec<f64>> = variants
            .iter()
            .map(|(_, v)| {
                let mut counts = vec![0usize; (k_hi - k_lo) as usize];
                for &x in v {
                    let k = ((x.max(1.0).log10() * 10.0).floor() as i32).clamp(k_lo, k_hi - 1);
                    counts[(k - k_lo) as usize] += 1;
                }
                counts
                    .iter()
                    .map(|&c| 100.0 * c as f64 / v.len().max(1) as f64)
                    .collect()
            })
            .collect();
        let top = shares.iter().flatten().fold(0.0f64, |m, &s| m.max(s)) * 1.1;

        let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(14)
            .x_label_area_size(50)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (edge(k_lo)..edge(k_hi))
                    .log_scale()
                    .with_key_points(key_points(edge(k_lo), edge(k_hi))),
                0.0..top.max(1.0),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("latency, COMMIT to broker ack (ms, log scale)")
            .y_desc("events (% of the variant's events)")
            .x_label_formatter(&|v| {
                if *v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            })
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (i, ((name, _), share)) in variants.iter().zip(&shares).enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(
                    share
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| **s > 0.0)
                        .map(|(j, &s)| {
                            let k = k_lo + j as i32;
                            Rectangle::new(
                                [(edge(k), 0.0), (edge(k + 1), s)],
                                colour.mix(0.25).filled(),
                            )
                        }),
                )
                .map_err(err)?;
            // The outline as a step line, so overlapping variants stay readable.
            let mut steps = vec![(edge(k_lo), 0.0)];
            for (j, &s) in share.iter().enumerate() {
                let k = k_lo + j as i32;
                steps.push((edge(k), s));
                steps.push((edge(k + 1), s));
            }
            steps.push((edge(k_hi), 0.0));
            chart
                .draw_series(LineSeries::new(steps, colour.stroke_width(2)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 18, y + 6)], colour.mix(0.6).filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)
    })
}

/// Lines of (seconds, events/s), one per series.
pub fn rate_over_time(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    lines(
        path,
        title,
        "seconds since the drain started",
        "events published per second",
        series,
    )
}

/// Lines of (x, y), one per series, on linear axes from 0.
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    guarded(title, || {
        let t_max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.0))
            .fold(0.0f64, f64::max);
        let r_max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        if t_max <= 0.0 {
            return Err("no samples to plot".into());
        }
        let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(14)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..t_max * 1.02, 0.0..(r_max * 1.1).max(1.0))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| crate::common::fmt_n(*v))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_font_is_an_error_naming_the_file_and_the_package() {
        let e = read_font(Path::new("/nonexistent/DejaVuSans.ttf")).unwrap_err();
        assert!(e.contains("/nonexistent/DejaVuSans.ttf"), "{e}");
        assert!(e.contains("fonts-dejavu-core"), "{e}");
    }

    #[test]
    fn plots_are_written_as_png() {
        if !Path::new(FONT).exists() {
            return; // the error path is tested above
        }
        let dir = std::env::temp_dir().join(format!("outbox-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lat = vec![("a".to_string(), vec![3.0, 12.0, 12.5, 40.0, 480.0])];
        latency_histogram(&dir.join("l.png"), "t", &lat).unwrap();
        let rate = vec![("b".to_string(), vec![(0.1, 100.0), (0.2, 300.0)])];
        rate_over_time(&dir.join("r.png"), "t", &rate).unwrap();
        for f in ["l.png", "r.png"] {
            let bytes = std::fs::read(dir.join(f)).unwrap();
            assert_eq!(&bytes[1..4], b"PNG");
        }
        assert!(latency_histogram(&dir.join("e.png"), "t", &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
