//! Running a storage call to its end even when its caller stops waiting.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that runs on its caller's task, and if dropped unfinished, has
/// what is left of it spawned onto the runtime, so it still runs to its end.
///
/// Renewals and releases need this: one given up on may still land (a server
/// runs a statement to its end after the client left), and its answer must
/// still be recorded. Spawning every one of them would cost a task and a
/// wake-up per call; this spawns only the ones actually given up on.
pub(crate) struct RunToEnd<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    /// The runtime the call was made on, where what is left of it goes
    /// (a drop may happen outside any runtime's context).
    runtime: Option<tokio::runtime::Handle>,
}

/// Runs `future` to its end, here or (if dropped first) on the runtime.
pub(crate) fn run_to_end<F>(future: F) -> RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    RunToEnd {
        future: Some(Box::pin(future)),
        runtime: tokio::runtime::Handle::try_current().ok(),
    }
}

impl<F> Future for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.future.as_mut().expect("polled after it finished");
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(ready) => {
                self.future = None;
                ready
            }
            Err(panic) => {
                // A call that panicked has ended: nothing is left to spawn.
                self.future = None;
                std::panic::resume_unwind(panic)
            }
        }
    }
}

impl<F> Drop for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(rest), Some(runtime)) = (self.future.take(), &self.runtime) {
            runtime.spawn(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn runs_on_the_callers_task_when_awaited() {
        let here = std::thread::current().id();
        let ran_on = run_to_end(async { std::thread::current().id() }).await;
        assert_eq!(ran_on, here);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_call_still_runs_to_its_end() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
        let (go_on_tx, go_on_rx) = tokio::sync::oneshot::channel::<()>();
        let call = run_to_end(async move {
            let _ = started_tx.send(());
            // Held here until after the caller gave up on it.
            let _ = go_on_rx.await;
            let _ = ended_tx.send(());
        });
        // Polled until it started, then given up on.
        let mut call = Box::pin(call);
        tokio::select! {
            _ = &mut call => unreachable!("it waits for go_on"),
            _ = started_rx => {}
        }
        drop(call);
        go_on_tx
            .send(())
            .expect("the dropped call's rest was dropped, not spawned");
        let ended = tokio::time::timeout(Duration::from_secs(10), ended_rx).await;
        assert!(
            matches!(ended, Ok(Ok(()))),
            "the dropped call did not run to its end: {ended:?}"
        );
    }
}
