//! Latency histograms: recorded in nanoseconds with 3 significant digits, one per thread,
//! merged at the end; summarised for the table and the JSON, and written as HdrHistogram
//! percentile distributions (`.hgrm`), the text format HdrHistogram's plotters read.

use std::io::{self, Write};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Significant value digits of every histogram.
pub const SIGFIG: u8 = 3;
/// The largest value recorded exactly (one hour in nanoseconds); larger ones saturate.
const HIGHEST_NS: u64 = 3_600_000_000_000;
/// `.hgrm` files give values in microseconds: nanoseconds divided by this.
pub const HGRM_SCALE: f64 = 1_000.0;
/// The unit of the values in `.hgrm` files.
pub const HGRM_UNIT: &str = "us";

/// A histogram of nanoseconds.
#[derive(Clone, Debug)]
pub struct Recorder {
    hist: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            hist: Histogram::new_with_bounds(1, HIGHEST_NS, SIGFIG).expect("valid bounds"),
        }
    }

    /// Records one value in nanoseconds (saturating at one hour).
    #[inline]
    pub fn record(&mut self, nanos: u64) {
        self.hist.saturating_record(nanos);
    }

    /// Adds every value of `other` (same bounds, so it cannot fail).
    pub fn merge(&mut self, other: &Recorder) {
        self.hist.add(&other.hist).expect("same bounds");
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Count, min, mean, the percentiles of the table and max, in nanoseconds.
    pub fn summary(&self, name: &str, description: &str) -> HistSummary {
        let h = &self.hist;
        let empty = h.is_empty();
        let at = |q: f64| if empty { 0 } else { h.value_at_quantile(q) };
        HistSummary {
            name: name.to_string(),
            description: description.to_string(),
            unit: "ns",
            count: h.len(),
            min: if empty { 0 } else { h.min() },
            mean: if empty { 0.0 } else { h.mean() },
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p99_9: at(0.999),
            max: if empty { 0 } else { h.max() },
            hgrm: None,
            hlog: None,
        }
    }
}

/// What the table and `summary.json` say about one histogram (values in nanoseconds).
#[derive(Clone, Debug, Serialize)]
pub struct HistSummary {
    pub name: String,
    pub description: String,
    pub unit: &'static str,
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub max: u64,
    /// The `.hgrm` file written beside `summary.json`, if any.
    pub hgrm: Option<String>,
    /// The `.hlog` interval log written beside `summary.json`, if any.
    pub hlog: Option<String>,
}

/// Writes `hist` as HdrHistogram's `outputPercentileDistribution` does: the header, one
/// line per percentile step (5 ticks per half distance), and the `#[Mean …]` footer. Values
/// are divided by `scale` (1000: nanoseconds written as microseconds) and printed with as
/// many decimals as the histogram has significant digits.
pub fn write_hgrm<W: Write>(hist: &Histogram<u64>, scale: f64, out: &mut W) -> io::Result<()> {
    let digits = usize::from(hist.sigfig());
    writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total: u64 = 0;
    if !hist.is_empty() {
        for step in hist.iter_quantiles(5) {
            total += step.count_since_last_iteration();
            let value = step.value_iterated_to() as f64 / scale;
            let quantile = step.quantile_iterated_to();
            if quantile < 1.0 {
                writeln!(
                    out,
                    "{value:>12.digits$} {quantile:>2.12} {total:>10} {:>14.2}",
                    1.0 / (1.0 - quantile)
                )?;
            } else {
                writeln!(out, "{value:>12.digits$} {quantile:>2.12} {total:>10}")?;
            }
        }
    }
    let (mean, stdev, max) = if hist.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (
            hist.mean() / scale,
            hist.stdev() / scale,
            hist.max() as f64 / scale,
        )
    };
    writeln!(
        out,
        "#[Mean    = {mean:>12.digits$}, StdDeviation   = {stdev:>12.digits$}]"
    )?;
    writeln!(
        out,
        "#[Max     = {max:>12.digits$}, Total count    = {:>12}]",
        hist.len()
    )?;
    writeln!(
        out,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        hist.buckets(),
        sub_bucket_count(hist.sigfig())
    )
}

/// HdrHistogram's sub-bucket count for a precision: the power of two at or above 2 × 10^sigfig.
fn sub_bucket_count(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(rec: &Recorder) -> String {
        let mut buf = Vec::new();
        write_hgrm(rec.histogram(), HGRM_SCALE, &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn hgrm_matches_the_java_layout() {
        let mut rec = Recorder::new();
        for v in 1..=10_000u64 {
            rec.record(v * 1_000); // 1 µs .. 10 ms
        }
        let text = render(&rec);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        // The first step is the minimum at percentile 0.
        assert_eq!(
            lines[2],
            "       1.000 0.000000000000          1           1.00"
        );
        let footer: Vec<&str> = lines[lines.len() - 3..].to_vec();
        assert_eq!(
            footer[0],
            "#[Mean    =     5000.505, StdDeviation   =     2886.752]"
        );
        // Max is the highest value equivalent to 10 ms at 3 digits, as in Java.
        assert!(
            footer[1].starts_with("#[Max     =    10002.431,"),
            "{}",
            footer[1]
        );
        assert!(footer[1].ends_with("Total count    =        10000]"));
        assert!(
            footer[2].ends_with("SubBuckets     =         2048]"),
            "{}",
            footer[2]
        );
        // The last data line is percentile 1.0 with the full count and no 1/(1-p) column.
        let last = lines[lines.len() - 4];
        let cols: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(cols.len(), 3, "{last}");
        assert_eq!(cols[1], "1.000000000000");
        assert_eq!(cols[2], "10000");
        // Values, percentiles and counts never go down.
        let mut prev = (0.0f64, 0.0f64, 0u64);
        for line in &lines[2..lines.len() - 3] {
            let c: Vec<&str> = line.split_whitespace().collect();
            let row = (
                c[0].parse::<f64>().unwrap(),
                c[1].parse::<f64>().unwrap(),
                c[2].parse::<u64>().unwrap(),
            );
            assert!(
                row.0 >= prev.0 && row.1 >= prev.1 && row.2 >= prev.2,
                "{line}"
            );
            prev = row;
        }
        // Around the median: 5 ticks per half distance gives 0.5 exactly.
        assert!(text.contains(" 0.500000000000 "), "{text}");
    }

    #[test]
    fn hgrm_of_an_empty_histogram_has_header_and_footer() {
        let text = render(&Recorder::new());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[2].starts_with("#[Mean    =        0.000"));
        assert!(lines[3].ends_with("Total count    =            0]"));
        assert!(lines[4].starts_with("#[Buckets = "));
    }

    #[test]
    fn single_value_and_merge() {
        let mut a = Recorder::new();
        a.record(42_000);
        let text = render(&a);
        // Values are the highest equivalent of their bucket (42 µs: within 32 ns at 3 digits).
        assert!(
            text.contains("      42.015 1.000000000000          1\n"),
            "{text}"
        );
        let mut b = Recorder::new();
        b.record(7_000);
        b.merge(&a);
        let s = b.summary("x", "test");
        assert_eq!((s.count, s.min, s.max), (2, 7_000, 42_015));
        assert!(b.histogram().equivalent(s.p50, 7_000), "{}", s.p50);
        assert!(s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.p99_9 && s.p99_9 <= s.max);
        let empty = Recorder::new().summary("e", "empty");
        assert_eq!((empty.count, empty.p99, empty.max), (0, 0, 0));
    }

    #[test]
    fn sub_buckets_follow_the_precision() {
        assert_eq!(sub_bucket_count(1), 32);
        assert_eq!(sub_bucket_count(2), 256);
        assert_eq!(sub_bucket_count(3), 2048);
    }
}
