//! `tern plot` on a small metrics file: a PNG is written for good input, and
//! bad input is one clear error line with nothing written.

use crate::support::{assert_clean_error, tern};

/// Six steps of the metrics the trainer writes (a null where a metric was NaN).
fn metrics() -> String {
    (0..6)
        .map(|s| {
            let loss = if s == 2 { "null".to_string() } else { format!("{}", 1.0 / (s + 1) as f64) };
            format!(
                r#"{{"step": {s}, "reward_mean": {}, "reward_std": 0.2, "loss": {loss}, "tokens_per_s": 55.0, "peak_rss_bytes": {}}}"#,
                0.3 + 0.05 * s as f64,
                812_345_678 + s * 1_000_000
            ) + "\n"
        })
        .collect()
}

#[test]
fn plot_writes_a_png_of_the_default_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.jsonl");
    std::fs::write(&file, metrics()).unwrap();
    let png = dir.path().join("curves.png");
    let out = tern(
        &["plot", file.to_str().unwrap(), "-o", png.to_str().unwrap()],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(bytes.len() > 1000, "{} bytes", bytes.len());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!(height, 3 * 320, "one panel per default key");
}

#[test]
fn plot_refuses_bad_input_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("metrics.jsonl");
    std::fs::write(&good, metrics()).unwrap();
    let png = dir.path().join("curves.png");
    let (g, p) = (good.to_str().unwrap(), png.to_str().unwrap());

    let out = tern(&["plot", "/nonexistent/metrics.jsonl", "-o", p], None);
    assert_clean_error(&out, "cannot read metrics file");

    let bad = dir.path().join("bad.jsonl");
    let mut text = metrics();
    text.push_str("{\"step\": 6, \"loss\": \n");
    std::fs::write(&bad, text).unwrap();
    let out = tern(&["plot", bad.to_str().unwrap(), "-o", p], None);
    assert_clean_error(&out, "bad.jsonl line 7: not JSON");

    let out = tern(&["plot", g, "-o", p, "--keys", "loss,accuracy"], None);
    assert_clean_error(&out, "key `accuracy` has no numeric value in any line");

    let out = tern(
        &["plot", g, "-o", p, "--font", "/nonexistent/font.ttf"],
        None,
    );
    assert_clean_error(&out, "cannot read font /nonexistent/font.ttf");
    assert!(!png.exists(), "a failed plot wrote {}", png.display());
}

/// Runs compared in one image: a key one run lacks (a dense run has no
/// `rho`) is a missing line, a dotted key reaches into `rho`, and labels must
/// match the files.
#[test]
fn plot_overlays_runs_with_nested_keys_and_smoothing() {
    let dir = tempfile::tempdir().unwrap();
    let dense = dir.path().join("dense.jsonl");
    std::fs::write(&dense, metrics()).unwrap();
    let sparse = dir.path().join("sparse.jsonl");
    let with_rho: String = (0..6)
        .map(|s| {
            format!(
                r#"{{"step": {s}, "reward_mean": 0.2, "loss": 0.5, "rho": {{"mean_rho": {}, "rejected_tokens": 3}}, "epochs": [{{"kl_ref": {}}}, {{"kl_ref": 0.5}}]}}"#,
                1.0 + 0.01 * s as f64,
                0.1 * s as f64
            ) + "\n"
        })
        .collect();
    std::fs::write(&sparse, with_rho).unwrap();
    let png = dir.path().join("cmp.png");
    let (d, s, p) = (
        dense.to_str().unwrap(),
        sparse.to_str().unwrap(),
        png.to_str().unwrap(),
    );
    let args = ["plot", d, s, "-o", p, "--keys", "reward_mean,rho.mean_rho"];
    let mut smooth = args.to_vec();
    smooth.extend(["--smooth", "3", "--labels", "dense,sparse"]);
    let out = tern(&smooth, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 panels, 2 files"));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
        2 * 320
    );

    let mut bad = args.to_vec();
    bad.extend(["--labels", "only-one"]);
    assert_clean_error(&tern(&bad, None), "--labels has 1 labels for 2 files");
    let out = tern(&["plot", d, s, "-o", p, "--keys", "rho.nope"], None);
    assert_clean_error(&out, "key `rho.nope` has no numeric value");

    // A number reaches into an array (the trainer's per-epoch figures); an
    // index past its end is a key no line has, and the error offers the
    // array's keys.
    let out = tern(&["plot", s, "-o", p, "--keys", "epochs.1.kl_ref"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tern(&["plot", s, "-o", p, "--keys", "epochs.2.kl_ref"], None);
    assert_clean_error(&out, "key `epochs.2.kl_ref` has no numeric value");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("epochs.0.kl_ref"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
