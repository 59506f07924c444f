//! A table as the dashboard reads and changes it: its counts, its failed rows, and redrive
//! and delete by id, through the broker it was registered with.

use std::marker::PhantomData;

use futures::future::BoxFuture;
use ruststream::adapter::Adapter;
use ruststream::{BrokerHandle, FailedRow, FailedRowsOf, InboxTable, PublishError, Stats, Value};

/// One registered table, with the adapter and the row type erased.
pub(crate) trait TableSource: Send + Sync + 'static {
    /// The table's counts now.
    fn stats(&self) -> BoxFuture<'_, Result<Stats, PublishError>>;
    /// A page of failed rows.
    fn failed(
        &self,
        limit: u32,
        after: Option<Value>,
    ) -> BoxFuture<'_, Result<Vec<FailedRow>, PublishError>>;
    /// Returns the failed row of this id to the queue; answers how many rows it returned.
    fn redrive(&self, id: Value) -> BoxFuture<'_, Result<u64, PublishError>>;
    /// Deletes the failed row of this id; answers how many rows it deleted.
    fn delete(&self, id: Value) -> BoxFuture<'_, Result<u64, PublishError>>;
}

/// `T`'s table through the broker `handle`.
pub(crate) struct Source<T, A: Adapter> {
    handle: BrokerHandle<A>,
    row: PhantomData<fn() -> T>,
}

impl<T, A: Adapter> Source<T, A> {
    pub(crate) fn new(handle: BrokerHandle<A>) -> Self {
        Self {
            handle,
            row: PhantomData,
        }
    }
}

impl<T: InboxTable, A: Adapter> TableSource for Source<T, A> {
    fn stats(&self) -> BoxFuture<'_, Result<Stats, PublishError>> {
        Box::pin(self.handle.stats::<T>())
    }

    fn failed(
        &self,
        limit: u32,
        after: Option<Value>,
    ) -> BoxFuture<'_, Result<Vec<FailedRow>, PublishError>> {
        Box::pin(async move { self.handle.failed_rows::<T>().list(limit, after).await })
    }

    fn redrive(&self, id: Value) -> BoxFuture<'_, Result<u64, PublishError>> {
        Box::pin(async move {
            self.handle
                .failed_rows::<T>()
                .redrive(FailedRowsOf::Ids(vec![id]))
                .await
        })
    }

    fn delete(&self, id: Value) -> BoxFuture<'_, Result<u64, PublishError>> {
        Box::pin(async move {
            self.handle
                .failed_rows::<T>()
                .delete(FailedRowsOf::Ids(vec![id]))
                .await
        })
    }
}
