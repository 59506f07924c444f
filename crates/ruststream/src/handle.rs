//! A broker as the service holds it: started by the runtime or by hand, and the publishers
//! taken from it.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::channel::oneshot;
use ruststream_core::spec::Described;
use ruststream_core::{
    ClosedCounts, FailedRow, FailedRowsOf, Publish, Published, ReadTable, Stats, TableRead, Time,
    Value,
};
use serde::Serialize;

use crate::adapter::Adapter;
use crate::codec::{Codec, Json};
use crate::driver::{self, Change, HandleState, Input, Sender};
use crate::error::{PublishError, StartError};
use crate::exec::Executor;
use crate::subscriber::{IntoSubscription, Subscription};
use crate::table::{InboxTable, MessageTable};

/// A broker over an adapter, as the service holds it: publishers come from it, and
/// `with_broker` takes it. Cloning it shares the broker.
pub struct BrokerHandle<A: Adapter> {
    adapter: Arc<A>,
    state: Arc<Mutex<HandleState>>,
}

impl<A: Adapter> Clone for BrokerHandle<A> {
    fn clone(&self) -> Self {
        Self {
            adapter: self.adapter.clone(),
            state: self.state.clone(),
        }
    }
}

impl<A: Adapter + fmt::Debug> fmt::Debug for BrokerHandle<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerHandle")
            .field("broker", &self.adapter)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl<A: Adapter> BrokerHandle<A> {
    /// A broker over `adapter`; nothing connects until it starts.
    pub fn new(adapter: A) -> Self {
        Self {
            adapter: Arc::new(adapter),
            state: Arc::new(Mutex::new(HandleState::Idle)),
        }
    }

    /// The adapter.
    pub fn adapter(&self) -> &A {
        &self.adapter
    }

    /// Starts the broker by hand with these subscriptions: opens the adapter, checks every
    /// table, and starts claiming. An adapter's broker offers the same as `start` and
    /// `start_on`, answering [`Error`](crate::Error).
    pub async fn start(
        &self,
        subscriptions: Vec<Subscription<A>>,
        executor: Arc<dyn Executor>,
    ) -> Result<RunningBroker<A>, StartError> {
        self.start_until(subscriptions, executor, None).await
    }

    /// [`BrokerHandle::start`], ended by `stop` in any phase of the start.
    pub(crate) async fn start_until(
        &self,
        subscriptions: Vec<Subscription<A>>,
        executor: Arc<dyn Executor>,
        stop: crate::start::StopSignal,
    ) -> Result<RunningBroker<A>, StartError> {
        let started = driver::start(
            self.adapter.clone(),
            subscriptions,
            executor,
            self.state.clone(),
            stop,
        )
        .await?;
        Ok(RunningBroker {
            tx: started.tx,
            closed: started.closed,
            handle: self.clone(),
        })
    }

    /// A publisher of `T` rows ([`Publisher::new`]). It answers [`Error::Closed`](crate::Error::Closed) until the
    /// broker starts and from its shutdown on.
    pub fn publisher<T: InboxTable>(&self) -> Publisher<T, A> {
        Publisher::new(self)
    }

    /// The failed rows of `T`'s table, to redrive or delete through this broker.
    pub fn failed_rows<T: InboxTable>(&self) -> FailedRows<T, A> {
        FailedRows::new(self)
    }

    /// `T`'s table's counts now ([`Stats`]): rows due, scheduled, in work, failed, processed,
    /// and the oldest due row's age. One cheap statement, fine to poll; [`Error::Closed`](crate::Error::Closed)
    /// while the broker is not running ([Stats](https://github.com/ruststream/ruststream/blob/main/docs/src/operating.md#stats)).
    pub async fn stats<T: InboxTable>(&self) -> Result<Stats, PublishError> {
        match read_table::<T>(&self.state, ReadTable::Stats).await? {
            TableRead::Stats(stats) => Ok(stats),
            TableRead::Failed(_) => unreachable!("a read of the counts answers counts"),
        }
    }

    /// Whether the broker is shut down.
    pub fn is_closed(&self) -> bool {
        matches!(
            *self
                .state
                .lock()
                .expect("the handle's state is never poisoned"),
            HandleState::Closed
        )
    }
}

/// A started broker, driven in the background until it shuts down: what an adapter's broker
/// answers when started by hand (`start`, `start_on`), and what the service runs.
pub struct RunningBroker<A: Adapter> {
    tx: Sender,
    closed: oneshot::Receiver<ClosedCounts>,
    handle: BrokerHandle<A>,
}

impl<A: Adapter + fmt::Debug> fmt::Debug for RunningBroker<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningBroker")
            .field("broker", self.broker())
            .finish()
    }
}

impl<A: Adapter> RunningBroker<A> {
    /// Stops every subscription's claims; deliveries in work go on and settle.
    pub fn stop(&self) {
        let _ = self.tx.unbounded_send(Input::Stop);
    }

    /// Completes when no message is in work.
    pub async fn drained(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.unbounded_send(Input::Drained(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Shuts the broker down ([Shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)): claims stop, jobs in work settle, keys are
    /// released, and a pool the adapter built closes. Answers what it did to the advisory locks.
    pub async fn shutdown(self) -> ClosedCounts {
        let _ = self.tx.unbounded_send(Input::Shutdown);
        self.closed.await.unwrap_or_default()
    }

    /// A publisher into `T`'s table; it answers [`Error::Closed`](crate::Error::Closed) from the shutdown on.
    pub fn publisher<T: InboxTable>(&self) -> Publisher<T, A> {
        Publisher::new(&self.handle)
    }

    /// The failed rows of `T`'s table, to redrive or delete through this broker.
    pub fn failed_rows<T: InboxTable>(&self) -> FailedRows<T, A> {
        FailedRows::new(&self.handle)
    }

    /// `T`'s table's counts now ([`BrokerHandle::stats`]).
    pub async fn stats<T: InboxTable>(&self) -> Result<Stats, PublishError> {
        self.handle.stats::<T>().await
    }

    /// The broker's handle.
    pub fn handle(&self) -> &BrokerHandle<A> {
        &self.handle
    }

    /// The broker: the adapter.
    pub fn broker(&self) -> &A {
        self.handle.adapter()
    }
}

/// Publishes rows into `T`'s table; take it from a broker's handle, a route or a running
/// broker. Until the broker starts and after its shutdown it writes nothing and answers
/// [`Error::Closed`](crate::Error::Closed) ([Publishing](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md)).
pub struct Publisher<T, A: Adapter> {
    state: Arc<Mutex<HandleState>>,
    row: PhantomData<fn() -> (T, A)>,
}

impl<T, A: Adapter> Clone for Publisher<T, A> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            row: PhantomData,
        }
    }
}

impl<T, A: Adapter> fmt::Debug for Publisher<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("row", &std::any::type_name::<T>())
            .field("broker", &std::any::type_name::<A>())
            .finish()
    }
}

/// A row to publish: the message, the values of the key's columns, when it is due.
#[derive(Clone, Debug, Default)]
pub struct Message {
    payload: Vec<u8>,
    columns: Vec<(&'static str, Value)>,
    due: Option<SystemTime>,
}

impl Message {
    /// A message encoded as JSON.
    pub fn json<M: Serialize>(message: &M) -> Result<Self, PublishError> {
        Self::encoded::<Json, M>(message)
    }

    /// A message encoded with `K`.
    pub fn encoded<K: Codec, M: Serialize>(message: &M) -> Result<Self, PublishError> {
        Ok(Self {
            payload: K::encode(message).map_err(PublishError::Encode)?,
            ..Self::default()
        })
    }

    /// A message of these bytes.
    pub fn bytes(payload: Vec<u8>) -> Self {
        Self {
            payload,
            ..Self::default()
        }
    }

    /// The value of a column the key reads, such as `channel`.
    pub fn column(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.columns.push((name, value.into()));
        self
    }

    /// Due at this time instead of now.
    pub fn due_at(mut self, at: SystemTime) -> Self {
        self.due = Some(at);
        self
    }

    /// The row the core writes.
    pub(crate) fn into_publish(self) -> Publish {
        Publish {
            id: None,
            payload: self.payload,
            columns: self.columns,
            due: self.due.map(|at| {
                let micros = at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_micros())
                    .unwrap_or(0);
                Time(i64::try_from(micros).unwrap_or(i64::MAX))
            }),
        }
    }
}

/// What a publisher of `T`'s rows publishes: a [`Message`], for any table, or a reference to
/// `T`'s message where `T`'s description names one ([`MessageTable`]), whose fields give the
/// key's columns.
pub trait IntoRow<T> {
    /// The row to publish.
    fn into_row(self) -> Result<Message, PublishError>;
}

impl<T> IntoRow<T> for Message {
    fn into_row(self) -> Result<Message, PublishError> {
        Ok(self)
    }
}

impl<T: MessageTable> IntoRow<T> for &T::Message {
    fn into_row(self) -> Result<Message, PublishError> {
        T::message_row(self)
    }
}

impl<T: InboxTable, A: Adapter> Publisher<T, A> {
    /// A publisher of `T` rows through the broker `handle` names.
    pub fn new(handle: &BrokerHandle<A>) -> Self {
        Self {
            state: handle.state.clone(),
            row: PhantomData,
        }
    }

    /// Publishes one job. Answers what it wrote: on a table that deduplicates publishes
    /// ([`InboxSpec::unique`](crate::InboxSpec::unique)) a row already there is not written and
    /// [`Published::skipped`] names it ([Publishing](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md)).
    pub async fn publish(&self, message: impl IntoRow<T>) -> Result<Published, PublishError> {
        self.send(vec![message.into_row()?]).await
    }

    /// Publishes one message encoded as JSON, due now.
    pub async fn publish_json<M: Serialize>(&self, message: &M) -> Result<Published, PublishError> {
        self.publish(Message::json(message)?).await
    }

    /// Publishes jobs together: every row is written, or, when a statement fails, none is; an
    /// empty batch writes nothing ([Publishing](https://github.com/ruststream/ruststream/blob/main/docs/src/publishing.md#the-publisher)).
    pub async fn publish_all(
        &self,
        messages: impl IntoIterator<Item = impl IntoRow<T>>,
    ) -> Result<Published, PublishError> {
        // Up to `PUBLISH_BATCH` rows go into one insert; more run as several inserts in one
        // transaction; on a table that deduplicates its publishes each row takes an insert of
        // its own.
        let messages = messages
            .into_iter()
            .map(IntoRow::into_row)
            .collect::<Result<Vec<Message>, PublishError>>()?;
        if messages.is_empty() {
            return Ok(Published::default());
        }
        self.send(messages).await
    }

    async fn send(&self, messages: Vec<Message>) -> Result<Published, PublishError> {
        let tx = running_sender(&self.state)?;
        let desc = *T::TABLE.table_desc();
        let rows = messages.into_iter().map(Message::into_publish).collect();
        let (reply, answer) = oneshot::channel();
        tx.unbounded_send(Input::Publish(Box::new((desc, rows)), reply))
            .map_err(|_| PublishError::Closed)?;
        answer.await.unwrap_or(Err(PublishError::Closed))
    }
}

/// The failed jobs of `T`'s table, through a broker: list them, return them to the queue
/// (redrive) or delete them. On a table without a `failed_at` column every call answers
/// [`Error::Invalid`](crate::Error::Invalid) ([Redrive](https://github.com/ruststream/ruststream/blob/main/docs/src/failures.md#redrive)).
pub struct FailedRows<T, A: Adapter> {
    state: Arc<Mutex<HandleState>>,
    row: PhantomData<fn() -> (T, A)>,
}

impl<T, A: Adapter> Clone for FailedRows<T, A> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            row: PhantomData,
        }
    }
}

impl<T, A: Adapter> fmt::Debug for FailedRows<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailedRows")
            .field("row", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T: InboxTable, A: Adapter> FailedRows<T, A> {
    /// The failed rows of `T`'s table through the broker `handle` names.
    pub fn new(handle: &BrokerHandle<A>) -> Self {
        Self {
            state: handle.state.clone(),
            row: PhantomData,
        }
    }

    /// Returns the failed rows `which` selects to the queue: due now, their attempts counted
    /// from zero, their `failed_at` and error cleared. Answers how many rows it returned.
    pub async fn redrive(&self, which: FailedRowsOf) -> Result<u64, PublishError> {
        self.send(which, true).await
    }

    /// Deletes the failed rows `which` selects. Answers how many rows it deleted.
    pub async fn delete(&self, which: FailedRowsOf) -> Result<u64, PublishError> {
        self.send(which, false).await
    }

    /// Up to `limit` failed rows, in id order, after the id `after` where it is given (the
    /// last id of the page before): each with its attempt, error, failed time and payload.
    pub async fn list(
        &self,
        limit: u32,
        after: Option<Value>,
    ) -> Result<Vec<FailedRow>, PublishError> {
        match read_table::<T>(&self.state, ReadTable::Failed { limit, after }).await? {
            TableRead::Failed(rows) => Ok(rows),
            TableRead::Stats(_) => unreachable!("a read of failed rows answers rows"),
        }
    }

    /// The failed row of this id, if there is one.
    pub async fn get(&self, id: impl Into<Value>) -> Result<Option<FailedRow>, PublishError> {
        match read_table::<T>(&self.state, ReadTable::FailedRow(id.into())).await? {
            TableRead::Failed(rows) => Ok(rows.into_iter().next()),
            TableRead::Stats(_) => unreachable!("a read of failed rows answers rows"),
        }
    }

    async fn send(&self, which: FailedRowsOf, redrive: bool) -> Result<u64, PublishError> {
        let tx = running_sender(&self.state)?;
        let change = Change {
            desc: *T::TABLE.table_desc(),
            which,
            redrive,
        };
        let (reply, answer) = oneshot::channel();
        tx.unbounded_send(Input::Change(Box::new(change), reply))
            .map_err(|_| PublishError::Closed)?;
        answer.await.unwrap_or(Err(PublishError::Closed))
    }
}

/// A read of `T`'s table's state through the running broker.
async fn read_table<T: InboxTable>(
    state: &Mutex<HandleState>,
    read: ReadTable,
) -> Result<TableRead, PublishError> {
    let tx = running_sender(state)?;
    let desc = *T::TABLE.table_desc();
    let (reply, answer) = oneshot::channel();
    tx.unbounded_send(Input::Read(Box::new((desc, read)), reply))
        .map_err(|_| PublishError::Closed)?;
    answer.await.unwrap_or(Err(PublishError::Closed))
}

/// The driver's sender while the broker runs; [`PublishError::Closed`] before and after.
fn running_sender(state: &Mutex<HandleState>) -> Result<Sender, PublishError> {
    match &*state.lock().expect("the handle's state is never poisoned") {
        HandleState::Running(tx) => Ok(tx.clone()),
        HandleState::Idle | HandleState::Closed => Err(PublishError::Closed),
    }
}

/// The subscriptions of one broker, as `with_broker`'s closure adds them.
pub struct BrokerScope<A: Adapter> {
    pub(crate) subscriptions: Vec<Subscription<A>>,
}

impl<A: Adapter> BrokerScope<A> {
    /// Adds a subscription.
    pub fn include<S: IntoSubscription<A>>(&mut self, subscription: S) -> &mut Self {
        self.subscriptions.push(subscription.into_subscription());
        self
    }
}

/// Something that is, or names, a broker: an adapter's broker type, or a route of it.
pub trait IntoBroker {
    /// The adapter.
    type Adapter: Adapter;

    /// The broker.
    fn into_broker(self) -> BrokerHandle<Self::Adapter>;
}

impl<A: Adapter> IntoBroker for BrokerHandle<A> {
    type Adapter = A;

    fn into_broker(self) -> BrokerHandle<A> {
        self
    }
}
