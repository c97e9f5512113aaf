//! HdrHistogram's percentile distribution in its text format (`.hgrm`), as Java's
//! `Histogram.outputPercentileDistribution(out, 5, 1000.0)` writes it: the value (here µs
//! from the ns the sinks record), the percentile level, the count up to that value and
//! 1/(1-percentile), then the mean, standard deviation, maximum, count and the histogram's
//! bucket shape. HdrHistogram's plotter and tools such as `hdr-plot` read it.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// Percentile ticks per half distance (HdrHistogram's customary 5).
pub const TICKS_PER_HALF: u32 = 5;

/// `h` (values in ns) as an `.hgrm` text with values in µs.
pub fn percentile_distribution(h: &Histogram<u64>) -> String {
    let scale = 1000.0;
    let digits = usize::from(h.sigfig());
    let mut s = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(TICKS_PER_HALF) {
            total += v.count_since_last_iteration();
            let value = v.value_iterated_to() as f64 / scale;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                let _ = writeln!(
                    s,
                    "{value:12.digits$} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                );
            } else {
                let _ = writeln!(s, "{value:12.digits$} {q:2.12} {total:10}");
            }
        }
    }
    let (mean, stdev, max) = if h.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (h.mean() / scale, h.stdev() / scale, h.max() as f64 / scale)
    };
    let _ = writeln!(
        s,
        "#[Mean    = {mean:12.digits$}, StdDeviation   = {stdev:12.digits$}]"
    );
    let _ = writeln!(
        s,
        "#[Max     = {max:12.digits$}, Total count    = {:12}]",
        h.len()
    );
    // Sub-buckets per bucket: the power of two that holds 2 × 10^sigfig values at unit
    // resolution (HdrHistogram's subBucketCount).
    let sub_buckets = (2.0 * 10f64.powi(i32::from(h.sigfig())))
        .log2()
        .ceil()
        .exp2() as u64;
    let _ = writeln!(
        s,
        "#[Buckets = {:12}, SubBuckets     = {sub_buckets:12}]",
        h.buckets()
    );
    s
}

/// The (value, percentile level, total count) rows of an `.hgrm` text.
pub fn parse(text: &str) -> Vec<(f64, f64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let v = it.next()?.parse().ok()?;
            let q = it.next()?.parse().ok()?;
            let n = it.next()?.parse().ok()?;
            Some((v, q, n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_of_a_known_histogram() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        // 1..=10,000 µs, one sample each.
        for us in 1..=10_000u64 {
            h.record(us * 1000).unwrap();
        }
        let text = percentile_distribution(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        let rows = parse(&text);
        assert!(rows.len() > 50, "{text}");
        // Levels rise, counts rise, the last row is 100% with every sample.
        assert!(
            rows.windows(2)
                .all(|w| w[0].1 <= w[1].1 && w[0].2 <= w[1].2)
        );
        let last = rows.last().unwrap();
        assert_eq!((last.1, last.2), (1.0, 10_000));
        assert!((last.0 - 10_000.0).abs() / 10_000.0 < 0.001, "{last:?}");
        // The median row: about 5,000 µs at level 0.5, with half the samples.
        let med = rows.iter().find(|r| r.1 == 0.5).unwrap();
        assert!((med.0 - 5000.0).abs() < 5.0, "{med:?}");
        assert!(med.2.abs_diff(5000) <= 5, "{med:?}");
        // Java's row shape: %12.3f %2.12f %10d %14.2f.
        let row = lines[2..]
            .iter()
            .find(|l| l.contains(" 0.500000000000 "))
            .unwrap();
        assert_eq!(row.len(), 12 + 1 + 14 + 1 + 10 + 1 + 14, "{row:?}");
        assert!(row.ends_with("           2.00"), "{row:?}");
        assert!(
            text.contains("#[Max     =    10002.431, Total count    =        10000]"),
            "{text}"
        );
        assert!(
            text.contains("#[Buckets =           26, SubBuckets     =         2048]"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_histogram_has_only_the_summary() {
        let h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        let text = percentile_distribution(&h);
        assert!(parse(&text).is_empty(), "{text}");
        assert!(text.contains("Total count    =            0]"), "{text}");
    }
}
