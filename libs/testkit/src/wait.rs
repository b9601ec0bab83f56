//! The one "wait until" of the test suites.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::Instant;

/// First pause between checks; it doubles up to [`MAX_POLL`], so a condition that holds
/// soon is seen soon and a slow one (an HTTP probe of a child process) is not hammered.
const FIRST_POLL: Duration = Duration::from_millis(5);
const MAX_POLL: Duration = Duration::from_millis(100);

/// What a check of [`wait_until`] returns: done (with a value) or not yet (with why).
pub trait Progress {
    type Done;
    fn progress(self) -> Result<Self::Done, String>;
}

impl Progress for bool {
    type Done = ();
    fn progress(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the condition never held".to_owned())
        }
    }
}

impl<T> Progress for Option<T> {
    type Done = T;
    fn progress(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".to_owned())
    }
}

impl<T, E: Display> Progress for Result<T, E> {
    type Done = T;
    fn progress(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs `check` until it is done — `true`, `Some(v)` or `Ok(v)` — and returns its value;
/// panics after `within` naming `what` and the last "not yet" (`Err(e)`'s message).
/// The check is always run once more at the deadline. Works under paused tokio time.
///
/// ```ignore
/// bigfleet_testkit::wait_until(Duration::from_secs(5), "the worker to connect", async || {
///     decide.streams().len() == 1
/// })
/// .await;
/// ```
pub async fn wait_until<C, F>(within: Duration, what: &str, mut check: F) -> C::Done
where
    C: Progress,
    F: AsyncFnMut() -> C,
{
    let deadline = Instant::now() + within;
    let mut pause = FIRST_POLL;
    loop {
        let last = match check().await.progress() {
            Ok(done) => return done,
            Err(why) => why,
        };
        let now = Instant::now();
        if now >= deadline {
            panic!("timed out after {within:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_the_check_is_done() {
        let mut n = 0;
        let v = wait_until(Duration::from_secs(1), "n to reach 3", async || {
            n += 1;
            if n >= 3 { Ok(n) } else { Err(format!("n={n}")) }
        })
        .await;
        assert_eq!(v, 3);
        let mut calls = 0;
        wait_until(Duration::from_secs(1), "a flag", async || {
            calls += 1;
            calls > 1
        })
        .await;
        assert_eq!(
            wait_until(Duration::ZERO, "a value", async || Some(7)).await,
            7
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for the impossible; last: still 1")]
    async fn panics_with_what_and_the_last_reason_at_the_deadline() {
        let started = Instant::now();
        let _: () = wait_until(Duration::from_secs(2), "the impossible", async || {
            assert!(started.elapsed() <= Duration::from_secs(2) + MAX_POLL);
            Err::<(), _>("still 1")
        })
        .await;
    }
}
