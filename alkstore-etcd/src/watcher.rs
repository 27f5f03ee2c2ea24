//! Wake-ups for waiting acquires: one watch per store on its grant keys
//! and tickets, for deletions only. A release, a forced release and a
//! lease's end all delete a grant's key, so every one of them wakes a
//! waiter of its name, in every process (the SQL engines hear of no
//! expiry). A ticket's deletion (its waiter granted, gone, or dead) cues
//! the waiter behind it, by the ticket's number: its create revision, which
//! the deletion's event carries in the key's last value.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use alkstore_core::ReleaseBus;
use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::keys::{Layout, prefix_end};
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use crate::proto::mvccpb::event::EventType;

/// The watch task of one store, started by its first waiting acquire.
#[derive(Debug)]
pub(crate) struct Watcher {
    client: Client,
    layout: Layout,
    bus: Arc<ReleaseBus>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Watcher {
    pub(crate) fn new(client: Client, layout: Layout, bus: Arc<ReleaseBus>) -> Self {
        Watcher {
            client,
            layout,
            bus,
            task: Mutex::new(None),
        }
    }

    /// Starts the watch, unless it runs.
    pub(crate) fn start(&self) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (client, layout, bus) = (self.client.clone(), self.layout.clone(), self.bus.clone());
        *task = Some(tokio::spawn(watch(client, layout, bus)));
    }

    /// Stops the watch.
    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Watches until aborted; after a broken watch, wakes every waiter (a
/// deletion may have been missed) and watches again.
async fn watch(client: Client, layout: Layout, bus: Arc<ReleaseBus>) {
    let grants = layout.grants();
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            range_end: prefix_end(&grants),
            key: grants,
            filters: vec![FilterType::Noput as i32],
            prev_kv: true,
            ..Default::default()
        })),
    };
    let mut pause = Duration::from_millis(50);
    loop {
        let opened = client
            .call(|mut m| {
                // The request stream stays open: closing it would end the
                // watch.
                let requests =
                    futures::stream::iter([create.clone()]).chain(futures::stream::pending());
                // Only from a member with a leader: a member cut off from
                // the quorum would keep the watch open and silent.
                let mut request = tonic::Request::new(requests);
                request.metadata_mut().insert(
                    "hasleader",
                    tonic::metadata::MetadataValue::from_static("true"),
                );
                async move { Ok(m.watch.watch(request).await?.into_inner()) }
            })
            .await;
        if let Ok(mut answers) = opened {
            while let Some(Ok(answer)) = answers.next().await {
                // Refused (a token etcd no longer knows: etcd cancels the
                // watch with "permission denied"), or ended by the server:
                // one read first, which authenticates again if that was
                // it, then watched again after a growing pause.
                if answer.canceled {
                    let _ = client.range(layout.grants(), Vec::new(), 1).await;
                    break;
                }
                if answer.created {
                    // Releases before the watch began went unheard.
                    bus.wake_all();
                    pause = Duration::from_millis(50);
                }
                for event in answer.events {
                    if event.r#type != EventType::Delete as i32 {
                        continue;
                    }
                    let Some(kv) = event.kv else { continue };
                    if let Some((name, _)) = layout.parse(&kv.key) {
                        bus.released(&name);
                    } else if let Some(name) = layout.parse_ticket(&kv.key) {
                        // Without its last value (compacted away), the
                        // waiter behind finds out at its next renewal.
                        let number = event.prev_kv.map(|prev| prev.create_revision);
                        if let Some(number) = number.and_then(|n| u64::try_from(n).ok()) {
                            bus.dequeued(&name, number);
                        }
                    }
                }
            }
        }
        bus.wake_all();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
