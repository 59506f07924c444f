//! A route: a broker with the name of a queue and the row type of its table; and the methods
//! every adapter's broker offers, whatever its constructors.

use std::fmt;
use std::marker::PhantomData;

use crate::adapter::Adapter;
use crate::handle::{BrokerHandle, IntoBroker, Publisher};
use crate::table::InboxTable;

/// A broker with the name of a queue and a publisher into `T`'s table, as `with_broker` takes
/// it (`route::<T>(name)` on an adapter's broker). The name is for logs and code: every
/// subscription included in the broker runs, whatever its queue.
pub struct Route<T, A: Adapter> {
    handle: BrokerHandle<A>,
    name: &'static str,
    row: PhantomData<fn() -> T>,
}

impl<T, A: Adapter> Clone for Route<T, A> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
            name: self.name,
            row: PhantomData,
        }
    }
}

impl<T, A: Adapter + fmt::Debug> fmt::Debug for Route<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.name)
            .field("row", &std::any::type_name::<T>())
            .field("broker", self.handle.adapter())
            .finish()
    }
}

impl<T, A: Adapter> Route<T, A> {
    /// The route of the queue `name` on the broker `handle` names.
    pub fn new(handle: BrokerHandle<A>, name: &'static str) -> Self {
        Self {
            handle,
            name,
            row: PhantomData,
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The broker's handle.
    pub fn handle(&self) -> &BrokerHandle<A> {
        &self.handle
    }
}

impl<T: InboxTable, A: Adapter> Route<T, A> {
    /// The name of `T`'s table.
    pub fn table(&self) -> &'static str {
        use ruststream_core::spec::Described;
        T::TABLE.table_desc().table
    }

    /// A publisher into `T`'s table. It answers [`Error::Closed`](crate::Error::Closed) until
    /// the service starts, and from its shutdown on.
    pub fn publisher(&self) -> Publisher<T, A> {
        Publisher::new(&self.handle)
    }
}

impl<T, A: Adapter> IntoBroker for Route<T, A> {
    type Adapter = A;

    fn into_broker(self) -> BrokerHandle<A> {
        self.handle
    }
}

/// Writes the methods every adapter's broker offers (`route`, `handle`, `start`, `start_on`
/// and [`IntoBroker`](crate::IntoBroker)) for an adapter type: `broker_methods!(impl RusqliteBroker);`
/// or `broker_methods!(impl<DB: SqlxDatabase> SqlxBroker<DB>);`.
#[macro_export]
macro_rules! broker_methods {
    (impl<$($generic:ident: $bound:path),+> $broker:ty) => {
        $crate::broker_methods!(@methods [$($generic: $bound),+] $broker);
    };
    (impl $broker:ty) => {
        $crate::broker_methods!(@methods [] $broker);
    };
    (@methods [$($generics:tt)*] $broker:ty) => {
        impl<$($generics)*> $broker {
            /// A route of `T`'s queue under `name` (the name its `InboxQueue::<T>::new(name)`
            /// subscriptions use): the broker as `with_broker` takes it, with a publisher into
            /// `T`'s table ([`ruststream::Route::publisher`]).
            pub fn route<T: $crate::InboxTable>(
                self,
                name: &'static str,
            ) -> $crate::Route<T, Self> {
                $crate::Route::new(self.handle(), name)
            }

            /// The broker as the service holds it, to take publishers from before the service
            /// starts ([`ruststream::Publisher::new`]); pass a clone of the same handle to
            /// `with_broker`. The same as [`ruststream::IntoBroker::into_broker`].
            pub fn handle(self) -> $crate::BrokerHandle<Self> {
                $crate::BrokerHandle::new(self)
            }

            /// Starts the broker by hand, without a service, with these subscriptions, on the
            /// executor of the calling context: it opens its connections, checks each table and
            /// starts taking jobs ([Rows in work](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md#rows-in-work)).
            pub async fn start(
                self,
                subscriptions: impl ::std::iter::IntoIterator<Item = $crate::Subscription<Self>>,
            ) -> ::std::result::Result<$crate::RunningBroker<Self>, $crate::Error> {
                self.start_on(subscriptions, $crate::exec::current()).await
            }

            /// Starts the broker by hand, as `start` does, on this executor. A broker whose
            /// driver runs on tokio still runs its connections on the tokio runtime the start
            /// is called in.
            pub async fn start_on(
                self,
                subscriptions: impl ::std::iter::IntoIterator<Item = $crate::Subscription<Self>>,
                executor: ::std::sync::Arc<dyn $crate::exec::Executor>,
            ) -> ::std::result::Result<$crate::RunningBroker<Self>, $crate::Error> {
                let running = $crate::BrokerHandle::new(self)
                    .start(subscriptions.into_iter().collect(), executor)
                    .await?;
                ::std::result::Result::Ok(running)
            }
        }

        impl<$($generics)*> $crate::IntoBroker for $broker {
            type Adapter = Self;

            /// Wraps the broker in a new handle: the same as its `handle()`.
            fn into_broker(self) -> $crate::BrokerHandle<Self> {
                $crate::BrokerHandle::new(self)
            }
        }
    };
}
