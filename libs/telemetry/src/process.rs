//! What every process exports besides its own metrics: the `process_*` family (CPU, memory,
//! file descriptors, threads, start time — read from `/proc` on Linux, absent elsewhere) and
//! `bigfleet_build_info{version, git_sha, service} 1`.

use std::sync::OnceLock;

use crate::{MetricsRegistry, TelemetryError};

/// Name of the build-info gauge.
pub const BUILD_INFO: &str = "bigfleet_build_info";

/// The workspace version every crate shares.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this was built from (short SHA), or `unknown` when built without git.
pub const GIT_SHA: &str = env!("BIGFLEET_GIT_SHA");

static SERVICE: OnceLock<String> = OnceLock::new();

/// Records the process's service name (done by [`crate::init`]); the first call wins.
pub fn set_service_name(name: &str) {
    let _ = SERVICE.set(name.to_owned());
}

/// The service name given to [`crate::init`], else the executable's file name, else
/// `unknown`.
pub fn service_name() -> &'static str {
    SERVICE.get_or_init(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown".to_owned())
    })
}

impl MetricsRegistry {
    /// Registers the `process_*` collector and `bigfleet_build_info` labelled with `service`.
    /// Idempotent: a registry that already has them is left as it is, so the ops server can
    /// call this on whatever registry it is handed.
    pub fn register_process_metrics(&self, service: &str) -> Result<(), TelemetryError> {
        if self.has(BUILD_INFO) {
            return Ok(());
        }
        let info = self.int_gauge_vec(
            BUILD_INFO,
            "Always 1: the version, the git commit it was built from and the service of this process.",
            &["version", "git_sha", "service"],
        )?;
        info.with_label_values(&[VERSION, GIT_SHA, service]).set(1);
        #[cfg(target_os = "linux")]
        self.register_boxed(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_process_metrics_are_exported_once() {
        let reg = MetricsRegistry::new();
        reg.register_process_metrics("bigfleet-test").unwrap();
        reg.register_process_metrics("bigfleet-test").unwrap();
        let text = reg.encode_text().unwrap();
        let line = format!(
            "bigfleet_build_info{{git_sha=\"{GIT_SHA}\",service=\"bigfleet-test\",version=\"{VERSION}\"}} 1"
        );
        assert!(text.contains(&line), "{line} missing from\n{text}");
        assert!(!GIT_SHA.is_empty());
        if cfg!(target_os = "linux") {
            for name in [
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_open_fds",
                "process_start_time_seconds",
            ] {
                assert!(
                    text.contains(&format!("# TYPE {name} ")),
                    "{name} missing from\n{text}"
                );
            }
            let rss: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
                .and_then(|v| v.parse().ok())
                .unwrap();
            assert!(rss > 0.0, "{text}");
        }
        let names: Vec<_> = reg.described().into_iter().map(|d| d.name).collect();
        assert!(names.contains(&BUILD_INFO.to_owned()), "{names:?}");
    }

    #[test]
    fn the_git_sha_is_a_plain_label_value() {
        assert!(
            !GIT_SHA.is_empty()
                && GIT_SHA.len() <= 40
                && GIT_SHA
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
            "{GIT_SHA}"
        );
    }
}
