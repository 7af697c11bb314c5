//! `tern plot`: training curves from metrics JSONL files as one PNG, one
//! panel per key against `step`, one line per file (runs compared side by
//! side), optionally smoothed by a trailing mean.
//!
//! Input is the trainer's `metrics.jsonl`: one JSON object per line with a
//! numeric `step` and numeric metrics (`reward_mean`, `loss`, `peak_rss_bytes`,
//! ...). Everything is checked before anything is drawn: a malformed line is
//! reported with its number, a key found in no line is named with the keys
//! that are there. A metric that is `null` on a line (serde_json writes NaN as
//! `null`) or missing from it is a gap, not an error. `*_bytes` keys (and `kv_bytes_*`) are shown
//! in MiB.
//!
//! Drawing uses plotters' bitmap backend in memory with ab_glyph text from a
//! TrueType file given by path, so no system font libraries are needed; the
//! image is encoded with `png` and written only once it is complete.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use plotters::prelude::*;

use clap::Args;

/// `tern plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Metrics files: one JSON object per line with a numeric `step` (the
    /// trainer's metrics.jsonl). Several files are drawn as one line each in
    /// every panel, to compare runs.
    #[arg(required = true, num_args = 1..)]
    pub file: Vec<PathBuf>,
    /// Legend labels, one per file, comma-separated (default: each file's
    /// directory name).
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Draw the trailing mean of this many steps instead of raw values
    /// (reward curves of small batches are noisy).
    #[arg(long, default_value_t = 1)]
    pub smooth: usize,
    /// PNG file to write.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Keys to plot, one panel each, comma-separated; `*_bytes` and `kv_bytes_*` keys are
    /// shown in MiB; a dotted key reaches into an object (`rho.mean_rho`) or, by a number,
    /// an array (`epochs.0.kl_ref`: the first PPO epoch's KL to the reference model).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "reward_mean,loss,peak_rss_bytes"
    )]
    pub keys: Vec<String>,
    /// TrueType/OpenType font for the labels.
    #[arg(long, default_value = crate::cli::plot::DEFAULT_FONT)]
    pub font: PathBuf,
}

/// Width of the image, in pixels.
const WIDTH: u32 = 1000;
/// Height of one panel, in pixels.
const PANEL_HEIGHT: u32 = 320;
/// Where Debian's fonts-dejavu-core puts its sans-serif face: `--font`'s default.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Series up to this many points get a marker on each; longer ones are lines.
const MAX_MARKED_POINTS: usize = 60;
/// The font family name the loaded font is registered under.
const FAMILY: &str = "sans-serif";

/// One panel's data: a key's values against step, per file.
struct Series {
    /// The panel title: the key, with its unit when converted.
    title: String,
    /// Per file: its label and `(step, value)` in file order.
    lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// Line colours, one per file, in order (matplotlib's first six).
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PlotArgs) -> Result<()> {
    check_output(&a.out)?;
    ensure!(
        a.file.len() <= COLORS.len(),
        "at most {} files per plot (got {})",
        COLORS.len(),
        a.file.len()
    );
    ensure!(
        a.labels.is_empty() || a.labels.len() == a.file.len(),
        "--labels has {} labels for {} files",
        a.labels.len(),
        a.file.len()
    );
    ensure!(a.smooth >= 1, "--smooth must be at least 1");
    let mut series: Vec<Series> = Vec::new();
    let mut found: Vec<(&PathBuf, Vec<String>)> = Vec::new();
    for (i, file) in a.file.iter().enumerate() {
        let label = match a.labels.get(i) {
            Some(l) => l.clone(),
            None => default_label(file),
        };
        let (read, seen) = read_metrics(file, &a.keys)?;
        found.push((file, seen));
        for (k, (title, points)) in read.into_iter().enumerate() {
            let points = smooth(&points, a.smooth);
            match series.get_mut(k) {
                Some(s) => s.lines.push((label.clone(), points)),
                None => series.push(Series {
                    title,
                    lines: vec![(label.clone(), points)],
                }),
            }
        }
    }
    // A key some runs lack (a dense run has no `rho`) is a missing line; a
    // key no file has is a typo.
    for (key, s) in a.keys.iter().zip(&series) {
        if s.lines.iter().all(|l| l.1.is_empty()) {
            let (file, seen) = &found[0];
            bail!(
                "key `{key}` has no numeric value in any line of {} (keys there: {})",
                if found.len() == 1 {
                    file.display().to_string()
                } else {
                    format!("any of the {} files", found.len())
                },
                seen.join(", ")
            );
        }
    }
    if a.smooth > 1 {
        for s in &mut series {
            s.title = format!("{} (mean of {} steps)", s.title, a.smooth);
        }
    }
    load_font(&a.font)?;
    let png = draw(&series)?;
    std::fs::write(&a.out, png).with_context(|| format!("cannot write {}", a.out.display()))?;
    let steps = series
        .iter()
        .flat_map(|s| s.lines.iter().map(|l| l.1.len()))
        .max()
        .unwrap_or(0);
    println!(
        "wrote {} ({} panels, {} files, up to {steps} points each)",
        a.out.display(),
        series.len(),
        a.file.len()
    );
    Ok(())
}

/// A file's legend label: its directory's name (runs write `RUN/metrics.jsonl`).
fn default_label(file: &Path) -> String {
    file.parent()
        .and_then(|p| p.file_name())
        .or_else(|| file.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string())
}

/// The trailing mean over `window` points (fewer at the start).
fn smooth(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let from = (i + 1).saturating_sub(window);
            let part = &points[from..=i];
            let mean = part.iter().map(|p| p.1).sum::<f64>() / part.len() as f64;
            (points[i].0, mean)
        })
        .collect()
}

/// `key` looked up in `obj`, reaching at each dot into a nested object by
/// name or into an array by position (`epochs.0.kl_ref`: the trainer logs
/// per-epoch figures as an array).
fn lookup<'a>(
    obj: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a serde_json::Value> {
    let mut parts = key.split('.');
    let mut v = obj.get(parts.next()?)?;
    for p in parts {
        v = match v {
            serde_json::Value::Object(m) => m.get(p)?,
            serde_json::Value::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// The output must be a `.png` in an existing directory; checked first so a
/// typo costs nothing.
fn check_output(out: &Path) -> Result<()> {
    let is_png = out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    ensure!(is_png, "output {} must be a .png file", out.display());
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    ensure!(
        dir.is_dir(),
        "cannot write {}: directory {} does not exist",
        out.display(),
        dir.display()
    );
    Ok(())
}

/// Reads `path` and returns, per key in the order of `keys`, the panel title
/// and the points.
/// Also returns the numeric keys the file has, for the error on a key no
/// file has.
#[allow(clippy::type_complexity)]
fn read_metrics(
    path: &Path,
    keys: &[String],
) -> Result<(Vec<(String, Vec<(f64, f64)>)>, Vec<String>)> {
    ensure!(!keys.is_empty(), "no keys to plot");
    if let Some(k) = keys.iter().find(|k| k.trim().is_empty() || *k == "step") {
        bail!("invalid key `{k}`: keys are metric names other than `step`");
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read metrics file {}", path.display()))?;
    let mut points: Vec<Vec<(f64, f64)>> = vec![Vec::new(); keys.len()];
    let mut seen: Vec<String> = Vec::new();
    let mut rows = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let Some(obj) = value.as_object() else {
            bail!("{}: expected a JSON object", at());
        };
        let Some(step) = obj.get("step").and_then(serde_json::Value::as_f64) else {
            bail!("{}: no numeric `step`", at());
        };
        for (key, v) in obj {
            if v.is_number() && key != "step" && !seen.contains(key) {
                seen.push(key.clone());
            }
            for (inner, w) in v.as_object().into_iter().flatten() {
                let dotted = format!("{key}.{inner}");
                if w.is_number() && !seen.contains(&dotted) {
                    seen.push(dotted);
                }
            }
            // An array of objects is offered by its first element's keys.
            let first = v
                .as_array()
                .and_then(|a| a.first())
                .and_then(|e| e.as_object());
            for (inner, w) in first.into_iter().flatten() {
                let dotted = format!("{key}.0.{inner}");
                if w.is_number() && !seen.contains(&dotted) {
                    seen.push(dotted);
                }
            }
        }
        for (key, pts) in keys.iter().zip(points.iter_mut()) {
            match lookup(obj, key) {
                None | Some(serde_json::Value::Null) => {}
                Some(v) => {
                    let Some(x) = v.as_f64() else {
                        bail!("{}: `{key}` is {v}, not a number", at());
                    };
                    pts.push((step, x / unit_divisor(key)));
                }
            }
        }
        rows += 1;
    }
    ensure!(rows > 0, "{} holds no metrics", path.display());
    let series = keys
        .iter()
        .zip(points)
        .map(|(key, points)| (title(key), points))
        .collect();
    Ok((series, seen))
}

/// Whether `key` counts bytes: `peak_rss_bytes`, and the trainer's
/// `kv_bytes_peak` / `kv_bytes_full`.
fn is_bytes(key: &str) -> bool {
    key.ends_with("_bytes") || key.contains("_bytes_")
}

/// Byte counts are plotted in MiB: a 9-digit axis is unreadable.
fn unit_divisor(key: &str) -> f64 {
    if is_bytes(key) {
        (1u64 << 20) as f64
    } else {
        1.0
    }
}

fn title(key: &str) -> String {
    match key.strip_suffix("_bytes") {
        Some(base) => format!("{base} (MiB)"),
        None if is_bytes(key) => format!("{key} (MiB)"),
        None => key.to_string(),
    }
}

/// Reads the TrueType font at `path` and registers it for all text. The bytes
/// are leaked: plotters keeps fonts for the process's lifetime, and this runs
/// once per process.
fn load_font(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| {
        format!(
            "cannot read font {} (install fonts-dejavu-core or pass --font with a .ttf file)",
            path.display()
        )
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| {
        anyhow::anyhow!(
            "{} is not a TrueType/OpenType font (pass --font with a .ttf file)",
            path.display()
        )
    })
}

/// Draws every series into an RGB buffer, one panel each, and encodes it as PNG.
fn draw(series: &[Series]) -> Result<Vec<u8>> {
    let (w, h) = (WIDTH, PANEL_HEIGHT * series.len() as u32);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((series.len(), 1));
        for (s, area) in series.iter().zip(&panels) {
            draw_panel(s, area)?;
        }
        root.present().map_err(plot_err)?;
    }
    encode_png(&rgb, w, h)
}

fn draw_panel(
    s: &Series,
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> Result<()> {
    let all = || s.lines.iter().flat_map(|l| l.1.iter());
    let xs = padded_range(all().map(|p| p.0));
    let ys = padded_range(all().map(|p| p.1));
    let mut chart = ChartBuilder::on(area)
        .caption(&s.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, ys)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(WHITE)
        .label_style((FAMILY, 14))
        .draw()
        .map_err(plot_err)?;
    for ((label, points), &color) in s.lines.iter().zip(COLORS.iter()) {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        // Markers on short runs, so a single step (or a series with gaps) shows.
        if points.len() <= MAX_MARKED_POINTS {
            let marks = points.iter().map(|&p| Circle::new(p, 3, color.filled()));
            chart.draw_series(marks).map_err(plot_err)?;
        }
    }
    if s.lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font((FAMILY, 14))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_err)?;
    }
    Ok(())
}

/// The span of `values` with 5% margins; a single value gets a unit span.
fn padded_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        0.5_f64.max(hi.abs() * 0.05)
    };
    (lo - pad)..(hi + pad)
}

fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().context("encoding PNG")?;
    writer.write_image_data(rgb).context("encoding PNG")?;
    writer.finish().context("encoding PNG")?;
    Ok(out)
}

/// plotters' errors carry the backend's error type; the message is what matters.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot failed: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_are_drawn_in_mib_whatever_the_bytes_position() {
        for key in ["peak_rss_bytes", "kv_bytes_peak", "kv_bytes_full"] {
            assert_eq!(unit_divisor(key), (1u64 << 20) as f64, "{key}");
            assert!(title(key).ends_with("(MiB)"), "{key}");
        }
        assert_eq!(title("peak_rss_bytes"), "peak_rss (MiB)");
        assert_eq!(unit_divisor("reward_mean"), 1.0);
        assert_eq!(title("rho.mean_rho"), "rho.mean_rho");
    }
}
